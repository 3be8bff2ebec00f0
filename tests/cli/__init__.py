"""The command line as a user meets it: the entry points, hints for other tools' habits, the README."""
