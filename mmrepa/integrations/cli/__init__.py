"""The shared pieces of the command-line tools in ``tools/``: the common arguments and the one
place errors become exit statuses (:mod:`.args`); config, input and output checks that fail in
one line before any work starts (:mod:`.config_checks`, :mod:`.inputs`, :mod:`.outputs`);
example batches (:mod:`.batches`); CPU / Slurm process groups (:mod:`.distributed`); training
on a user's own data folder (:mod:`.own_data`); the runner, and the garbage collector's
setting of a tool process (:mod:`.runner`)."""
