"""The promoted snapshot and its formats: promotion, verification, packed rows, the
Megatron export and the quality report."""
