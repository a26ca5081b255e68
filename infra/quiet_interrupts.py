"""
Imported first by every command, before torch: a Ctrl-C in the first seconds, while torch loads, ends the command
quietly with status 130 instead of a KeyboardInterrupt traceback through the import machinery. run_main
(infra/configurator.py) restores the usual handling as soon as the command starts.
"""
import signal
import sys

signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(130))
