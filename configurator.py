"""
Command-line overrides, nanoGPT style, and clean errors for every script.

    python train.py config/train_shakespeare_char.py --arch=bert --batch_size=32

A positional `config/*.py` file is executed first (it may only set known keys), then each `--key=value` is
parsed as a Python literal and must match the type of the default. Anything wrong raises UserError, which
`run_main` turns into one line on stderr and exit status 2: no traceback, nothing written.
"""
import ast
import difflib
import os
import sys


class UserError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


def run_main(main):
    prog = os.path.basename(sys.argv[0]) or "python"
    try:
        main()
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)


def _check_type(key, value, default):
    if default is None or isinstance(default, str) and isinstance(value, str):
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, tuple):
        if isinstance(value, (tuple, list)):
            return tuple(value)
    elif isinstance(value, type(default)):
        return value
    raise UserError(f"--{key}={value!r} has the wrong type: expected {type(default).__name__} "
                    f"like the default {default!r}")


def _unknown(key, known):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean --{close[0]}?" if close else "run with --help to list the options"
    return UserError(f"unknown option --{key}: {hint}")


def apply_overrides(defaults, argv):
    """Return a copy of `defaults` updated from argv (config files and --key=value). Raises UserError."""
    config = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print("options (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
            sys.exit(0)
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} not found (pass config/<name>.py or --key=value)")
            values = {}
            try:
                exec(open(arg).read(), {}, values)
            except Exception as e:  # a broken config file is a user error too
                raise UserError(f"config file {arg!r} failed to run: {type(e).__name__}: {e}") from None
            for key, value in values.items():
                if key.startswith("_"):
                    continue
                if key not in defaults:
                    raise _unknown(key, defaults)
                config[key] = _check_type(key, value, defaults[key])
            continue
        key, has_value, text = arg[2:].partition("=")
        if key not in defaults:
            raise _unknown(key, defaults)
        if not has_value:
            if isinstance(defaults[key], bool):
                config[key] = True  # --flag alone means --flag=True
                continue
            raise UserError(f"--{key} needs a value: --{key}=<value>")
        if isinstance(defaults[key], str):
            value = text  # a string option takes the text as typed: --start=2024 is the prompt "2024"
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # not a Python literal: reported as the wrong type below
        config[key] = _check_type(key, value, defaults[key])
    return config
