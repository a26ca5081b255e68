"""
A process that has imported torch and numpy once and forks a child for each command a test runs: a command that
ends in one line (a wrong flag, a missing file) then costs its own work, not a new interpreter and torch's import
each time (about 1.5 s of the 2 cores, two hundred times in the suite).

The child runs the script as `python script args` does: its sys.argv, sys.path[0] the script's folder, run as
__main__ in the working folder the test names, the test's environment, stdin empty, its own stdout, stderr and
exit status (SystemExit's code; an uncaught exception prints its traceback and ends with status 1; the exit
handlers run). What differs from a new interpreter: torch and numpy are already imported (with the environment the
server started in), so a command run with another environment (env=...) gets a new interpreter instead.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

SERVER = r'''
import atexit, json, os, runpy, sys, traceback
import numpy, torch  # noqa: F401  (what every command imports: paid once, here)

def child(request):
    os.setsid()  # its own process group: a timeout kills it and what it started
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(os.path.join(request["folder"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdin = open(os.devnull)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(request["script"])
    code = 0
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B902  (as the interpreter does: the traceback, status 1)
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
'''

_server = None


def server():
    """The one server process of this test session, started at first use."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
    return _server


def stop_server():
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        _server.wait(timeout=30)


def run(script, args, cwd, timeout):
    """subprocess.run([python, script, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout), in a
    child of the preloaded server; returns a CompletedProcess."""
    process = server()
    with tempfile.TemporaryDirectory() as folder:
        request = dict(script=script, args=list(args), cwd=cwd, env=dict(os.environ), folder=folder)
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        pid = json.loads(process.stdout.readline())["pid"]
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            os.killpg(pid, signal.SIGKILL)
            process.stdout.readline()
            raise subprocess.TimeoutExpired([sys.executable, script, *args], timeout)
        status = json.loads(process.stdout.readline())["status"]
        with open(os.path.join(folder, "stdout")) as out, open(os.path.join(folder, "stderr")) as err:
            return subprocess.CompletedProcess([sys.executable, script, *args], status, out.read(), err.read())
