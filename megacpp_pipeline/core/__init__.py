"""The contracts every stage shares: the catalog, the ledger, the table schemas and the
gate shape."""
