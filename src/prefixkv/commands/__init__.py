"""The subcommands of ``prefixkv``, one thin module each."""
