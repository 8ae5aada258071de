"""What the library knows of a config, for :func:`mmrepa.apis.load_config`, the tools and the
excepthook alike: :mod:`.checks` (types, parts, ``custom_imports``, the backbone built alone, a
checkpoint's fit), :mod:`.key_checks` (every key against what it configures), :mod:`.paths`
(configs found where they moved), :mod:`.inputs` (the files a config reads) and
:mod:`.explain` (an uncaught error as one line). Importing it imports none of them."""
