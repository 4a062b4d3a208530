"""Reading a bash launch script without running it: words.py cuts it into tokens, parse.py groups them into
commands, expand.py expands words against the variables the script set (arithmetic.py, conditions.py), and
run.py follows the commands to the one wanted (`follow`)."""
