"""`megacpp plan`: a run sized before it starts. Sources are listed, not collected (sizing.py);
each stage group's CPU seconds, wall, memory and disk follow from rates the bench measured on
end-to-end runs (rates.py, rates.json); forecast.py says whether the run fits the memory and
disk it is given, table.py prints it, and command.py refuses it (exit 3), naming the stage
group and the figure, when it does not."""
