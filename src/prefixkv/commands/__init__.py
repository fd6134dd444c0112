"""The ``prefixkv`` subcommands, one thin module each: flags, a call into the library, output.

A command module holds a ``setup(parser)`` that adds the command's flags and returns the
function that runs it; :mod:`prefixkv.cli` registers each one by name and owns ``main``,
the exit codes and the ``--json`` conventions. NOTE: no library module imports this
package: the drivers it calls (:mod:`prefixkv.simulation`, :mod:`prefixkv.serving`,
:mod:`prefixkv.benchmarks`, :mod:`prefixkv.kernels.bench`, :mod:`prefixkv.proofs`) return
data, and only a command prints it.
"""
