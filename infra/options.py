"""
A command's options as its file writes them: `DEFAULTS = dict(...)` read from the source (each key with its
default and the comment beside it), without importing the command or torch. --help prints them; an unknown
--key is refused from them before torch loads (infra/quiet_interrupts.py), and again by apply_overrides.
"""
import ast
import difflib
import os
import sys


def options_block(path):
    """(the source lines of `DEFAULTS = dict(...)` in the file at path, its keys), or (None, None) when the file
    has no such literal block (its keys are then checked later, by apply_overrides)."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None, None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["DEFAULTS"] \
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict" \
                and not node.value.args and all(k.arg for k in node.value.keywords):
            lines = source.splitlines()[node.lineno - 1:node.end_lineno]
            return lines, [k.arg for k in node.value.keywords]
    return None, None


COMMON = {  # options many commands share: said once here rather than beside every DEFAULTS
    "scale": "which sizes (SCALES in the file): cpu (a 2-core laptop's minutes) or gpu",
    "quick": "True: a smoke run in seconds, written to out-quick/ (its numbers mean nothing)",
    "device": "auto | cpu | cuda | cuda:N | mps",
    "dataset": "a folder of data/ (prepared on first use) or a path to one holding train.bin, val.bin, meta.pkl",
    "out_dir": "where the results (or the checkpoint) go",
    "seed": "the first seed; a command with several seeds uses the ones after it",
    "jobs": "how many training runs at once, one process each (the cores the machine has)",
    "reuse": "True: runs finished earlier with the same settings are loaded, not retrained",
}


def help_text(path, keys_shown=None):
    """What --help prints: how to call the command, then its options as its file defines them."""
    lines, keys = options_block(path)
    name = os.path.basename(path)
    head = f"usage: python {name} [a config file] [--key=value ...]; its options, as {name} defines them (the default, then what it " \
           f"is):"
    if lines is None:
        return head + "\n" + "\n".join(f"  --{k}={v!r}" for k, v in (keys_shown or {}).items())
    lines = [lines[0].split("dict(", 1)[1]] + lines[1:]  # keys may share the opening or the closing line
    code, hash_, comment = lines[-1].partition("#")
    lines[-1] = code.rstrip()[:-1] + ("  " + hash_ + comment if hash_ else "")  # the closing parenthesis
    body = [line for line in lines if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in body[1:] if line.strip()), default=0)
    body = [body[0].strip()] + [line[indent:] for line in body[1:]] if body else []
    common = [f"  --{key}: {words}" for key, words in COMMON.items() if key in keys]
    return head + "\n" + "\n".join("  " + line for line in body) + ("\nshared by several commands:\n" +
                                                                   "\n".join(common) if common else "")


def answer_at_once(argv, path):
    """--help: print it, exit 0; an unknown --key: one line, exit 2 (as apply_overrides would say, seconds sooner)."""
    if path is None or not path.endswith(".py") or options_block(path)[0] is None:
        return  # a command without a DEFAULTS block answers on its own
    if any(arg in ("-h", "--help") for arg in argv):
        try:
            print(help_text(path), flush=True)
        except BrokenPipeError:  # (python train.py --help | head): the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    _, keys = options_block(path)
    for arg in argv:
        key = arg[2:].partition("=")[0] if arg.startswith("--") else None
        if keys and key is not None and key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean --{close[0]}?" if close else "run with --help to list the options"
            print(f"{os.path.basename(path)}: error: unknown option --{key}: {hint}", file=sys.stderr)
            sys.exit(2)
