"""
Imported first by every command, before torch (which takes seconds to load):
- a Ctrl-C in those first seconds ends the command quietly with status 130 instead of a KeyboardInterrupt traceback
  through the import machinery (run_main, infra/configurator.py, restores the usual handling once the command
  starts);
- `--help`, and an option the command does not have, are answered at once, from the command's own DEFAULTS as its
  file writes them (each key with its default and the comment beside it): a typo costs no wait.
"""
import os
import signal
import sys

signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(130))

from infra.options import answer_at_once  # noqa: E402  (torch-free: the command's own file, read as text)

_main = sys.modules.get("__main__")
if getattr(_main, "__file__", None) and os.path.abspath(_main.__file__) == os.path.abspath(sys.argv[0]):
    answer_at_once(sys.argv[1:], _main.__file__)  # only when imported by the command being run
