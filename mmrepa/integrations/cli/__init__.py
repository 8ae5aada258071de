"""The shared pieces of the command-line tools in ``tools/``: config and input checks that
fail in one line before any work starts (:mod:`.config_checks`, :mod:`.inputs`) and training
on a user's own data folder (:mod:`.own_data`)."""
