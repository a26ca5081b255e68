"""
Command-line overrides, nanoGPT style, device choice, and clean errors for every script.

    python train.py config/train_shakespeare_char_cpu.py --arch=bert --batch_size=32

A positional `config/*.py` file is executed first (it is Python, as in nanoGPT: its plain values must be known
keys; modules it imports and functions it defines are ignored), then each `--key=value` is parsed as a Python
literal and must match the type of the default. Anything wrong raises UserError, which `run_main` turns into one
line on stderr and exit status 2: no traceback, nothing written.
"""
import ast
import difflib
import math
import os
import shutil
import signal
import stat
import sys
import threading
import types

import torch


class UserError(Exception):
    """A mistake the user can fix: printed as one line, exit status 2."""


class Failure(Exception):
    """Work that failed, not a wrong command (a full disk, a run that diverged or died): one line, exit status 1."""


def run_main(main, interrupted="nothing written"):
    """Run a command's main: a UserError is one line on stderr and exit status 2; Ctrl-C or SIGTERM outside the
    command's own stop handling ends with one line saying what is kept (`interrupted`), status 130; standard output
    closed early (`| head`) ends silently, as Unix tools do; standard output that cannot be written (a full disk)
    is one line, status 1. Under torchrun only the first process prints."""
    prog = os.path.basename(sys.argv[0]) or "python"
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    # torchrun: the other processes would print the same line again (a stray RANK of no such world still speaks)
    quiet = rank.isdigit() and world.isdigit() and 0 < int(rank) < int(world)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (quiet_interrupts silenced the imports)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # SIGTERM: the same clean ending as Ctrl-C
    if sys.stdout is None:  # started with standard output closed (>&-): what would be printed goes nowhere
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    for stream in (sys.stdout, sys.stderr):  # a character the terminal cannot show is escaped, never an error
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    original_stdout, sys.stdout = sys.stdout, _StandardOutput(sys.stdout)
    try:
        main()
        sys.stdout.flush()  # a closed pipe shows here, inside, rather than at exit
    except UserError as e:
        _say(quiet, f"{prog}: error: {e}")
        sys.exit(2)
    except Failure as e:
        _say(quiet, f"{prog}: error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        _say(quiet, f"{prog}: interrupted; {interrupted}")
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (python masks.py | head -1): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except StandardOutputError as e:
        _say(quiet, f"{prog}: error: cannot write to standard output ({e.strerror})")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    finally:
        sys.stdout = original_stdout


def run_demo(demo):
    """`python <chapter file>.py`: the file's demo, under run_main (| head ends quietly, closed or full standard
    output is one line, Ctrl-C 130). The demos take no arguments: --help prints the first paragraph of the file's
    docstring, anything else is refused in one line, exit 2."""
    prog = os.path.basename(sys.argv[0])

    def main():
        args = sys.argv[1:]
        if args in (["-h"], ["--help"]):
            doc = (sys.modules["__main__"].__doc__ or "").strip().split("\n\n")[0]
            print(f"usage: python {prog} (no options: it runs the file's demo)\n{doc}")
            return
        if args:
            raise UserError(f"no arguments expected (got {' '.join(args)}): python {prog} runs its demo, "
                            f"python {prog} --help says what it shows")
        demo()
    run_main(main)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _say(quiet, line):
    if not quiet:
        print(line, file=sys.stderr)


class StandardOutputError(OSError):
    """Standard output cannot be written (a full disk, an I/O error): not a file the command writes."""


class _StandardOutput:
    """sys.stdout, whose write errors say that they are standard output's; a closed pipe stays BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream

    def _guarded(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StandardOutputError(e.errno, e.strerror) from None

    def write(self, text):
        return self._guarded(self._stream.write, text)

    def flush(self):
        return self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _check_type(key, value, default, current=None):
    """value checked against the type of the key's default; `current`, the value in use before it (a config
    file's, where one set it), is the example the message gives."""
    if default is None or isinstance(default, str) and isinstance(value, str):
        return value
    if default == "auto" and isinstance(value, bool):  # --compile: auto, or a config file's True / False
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # NaN and inf pass every "<" check: refuse them here, for every script
                raise UserError(f"--{key}={value!r} is not a finite number")
            return float(value)
    elif isinstance(default, tuple):
        if isinstance(value, (tuple, list)):
            return tuple(value)
    elif isinstance(value, type(default)):
        return value
    example = default if current is None else current
    quoted = f": in a config file write {key} = \"{value}\"" if isinstance(default, str) else ""  # a text option
    raise UserError(f"--{key}={value!r} has the wrong type: expected {type(default).__name__}, like "
                    f"{example!r}" + (" (the value in use)" if example != default else " (the default)") + quoted)


def _unknown(key, known):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean --{close[0]}?" if close else "run with --help to list the options"
    return UserError(f"unknown option --{key}: {hint}")


def apply_overrides(defaults, argv):
    """Return a copy of `defaults` updated from argv (config files and --key=value). Raises UserError."""
    config = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            from infra.options import help_text
            print(help_text(sys.argv[0], defaults))
            sys.exit(0)
        if not arg.startswith("--"):
            if os.path.isdir(arg):
                raise UserError(f"config file {arg!r} is a folder: pass a file such as config/<name>.py")
            if not os.path.isfile(arg):
                raise UserError(f"config file {arg!r} not found (pass config/<name>.py or --key=value)")
            values = {}
            try:
                exec(read_text_file(arg, "config file"), {}, values)
            except UserError:
                raise
            except SystemExit:  # sys.exit() in a config file must not end the command as if it had run
                raise UserError(f"config file {arg!r} calls sys.exit(): a config file only sets values") from None
            except Exception as e:  # a broken config file is a user error too
                raise UserError(f"config file {arg!r} failed to run: {type(e).__name__}: {e}") from None
            for key, value in values.items():
                if key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type)):
                    continue  # helpers of the config file, not settings
                if key not in defaults:
                    raise _unknown(key, defaults)
                config[key] = _check_type(key, value, defaults[key])
            continue
        key, has_value, text = arg[2:].partition("=")
        if any("\udc80" <= c <= "\udcff" for c in arg):  # bytes the locale's codec could not read (LC_ALL=C)
            import locale
            raise UserError(f"--{key}: the terminal's locale ({locale.getpreferredencoding(False)}) cannot read "
                            f"its non-ASCII characters: use a UTF-8 locale (export LC_ALL=C.UTF-8) or PYTHONUTF8=1")
        if key not in defaults:
            raise _unknown(key, defaults)
        if not has_value:
            if isinstance(defaults[key], bool):
                config[key] = True  # --flag alone means --flag=True
                continue
            raise UserError(f"--{key} needs a value: --{key}=<value> (the default: {defaults[key]!r})")
        if isinstance(defaults[key], str):
            value = text  # a string option takes the text as typed: --start=2024 is the prompt "2024"
        else:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # not a Python literal: reported as the wrong type below
            if isinstance(defaults[key], float) and text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
                value = float(text)  # a number, not a literal: refused below as not finite, like a config file's
        config[key] = _check_type(key, value, defaults[key], config[key])
    for key, check in (("seed", check_seed), ("device", check_device)):  # the options every script shares
        if key in config:
            check(config[key])
    return config


def read_text_file(path, what, hint=""):
    """The UTF-8 text of a regular file, or one line that says why not (missing, a folder, a pipe or device,
    unreadable, not UTF-8): the config files, prompts and prepare scripts' inputs all read through it."""
    if not os.path.exists(path):
        raise UserError(f"{what} {path} does not exist" + (f": {hint}" if hint else ""))
    if os.path.isdir(path):
        raise UserError(f"{what} {path} is a folder: pass a file")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise UserError(f"{what} {path} is not a regular file (a pipe or a device): pass a file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror})") from None


# ----------------------------------------------------------------------------- devices

def check_device(name):
    """--device: auto, or a device this machine has (resolved later by pick_device)."""
    if name != "auto":
        pick_device(name)


def pick_device(name):
    """auto picks CUDA, then MPS, then the CPU; an explicit device that is not there is a UserError."""
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device={name}: auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device={name} but CUDA is not available here: use --device=cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device={name} but this machine has {torch.cuda.device_count()} GPU(s): cuda:0 .. "
                        f"cuda:{torch.cuda.device_count() - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device=mps but MPS is not available here: use --device=cpu (or auto)")
    if device.type == "cpu" and device.index is not None:
        raise UserError(f"--device={name}: the CPU takes no index, use --device=cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"unknown --device={name}: auto, cpu, cuda, cuda:N or mps")
    return name


def check_seed(seed):
    if not 0 <= seed < 2 ** 32:  # torch and numpy take larger seeds, but the project adds offsets to them
        raise UserError(f"--seed={seed} is out of range: use 0 <= seed < 2**32")


# ----------------------------------------------------------------------------- where results go

QUICK_OUTPUT = "out-quick"  # ignored by git (out*/): a smoke run's figures mean nothing and never land in results/
QUICK_NOTE = ("**A --quick smoke run: tiny models trained for seconds. Its numbers show that every path runs, not "
              "what any model can do: do not read them.**")


def output_folder(config, defaults):
    """Where a command writes its results: --out_dir as given; a --quick smoke run left at the default writes to
    out-quick/<the default's last folder> instead."""
    if not str(config["out_dir"]).strip():
        raise UserError(f"--out_dir is empty: name a folder (the default is {defaults['out_dir'] or 'the current one'})")
    if config.get("quick") and config["out_dir"] == defaults["out_dir"]:
        return os.path.join(QUICK_OUTPUT, os.path.basename(defaults["out_dir"].rstrip("/")))
    return config["out_dir"]


def check_input_folder(config, option, default, what):
    """A folder a command reads (not the one it writes), checked before any work: empty, or a file, is one line
    now. what: whose folder it is, e.g. "the --out_dir of experiments/study.py". A missing folder is the caller's
    to judge (some make it: a study that is not there yet trains there)."""
    value = str(config[option.lstrip("-")])
    if not value.strip():
        raise UserError(f"{option} is empty: name {what} (the default is {default})")
    if os.path.exists(value) and not os.path.isdir(value):
        raise UserError(f"{option}={value} is a file: pass {what} (default {default})")


def check_compiler(device, option="--compile=True"):
    """torch.compile on a CPU writes C++ and builds it: without a C++ compiler it fails minutes later, deep inside
    inductor. Say so at once instead."""
    if str(device).startswith("cpu") and not any(shutil.which(name) for name in
                                                  (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
        raise UserError(f"{option} on the CPU needs a C++ compiler (g++ or clang++), and none is on the PATH: install "
                        f"one (apt-get install g++) or drop {option}")
