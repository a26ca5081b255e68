"""
Data parallel training (DDP): one process per device under torchrun, each on different windows, gradients
averaged every step. Everything the processes must agree on (when to stop, whether to save, whether the loss
diverged, one process's error) goes through `Processes`, so train.py's loop reads the same with one process
(where every method below is trivial) or many.

    torchrun --standalone --nproc_per_node=2 train.py ...   # gloo on CPUs, NCCL on GPUs
    python -m infra.parallel --standalone --nproc_per_node=2 train.py ...   # the same, ending as train.py ends
"""
import os

import torch

from infra.configurator import UserError, pick_device


TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets, every one


def under_torchrun():
    """Data parallel only in a complete, consistent torchrun environment; a stray RANK (or a partial set) is refused
    in one line, where init_process_group would raise a traceback or wait half an hour for peers."""
    present = [name for name in TORCHRUN if name in os.environ]
    if not present:
        return False
    missing = [name for name in TORCHRUN if name not in os.environ]
    try:
        rank, world, local = (int(os.environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) if not missing \
            else (0, 1, 0)
    except ValueError:
        missing = ["RANK, WORLD_SIZE and LOCAL_RANK as whole numbers"]
    if missing or not (0 <= rank < world and 0 <= local <= rank):
        raise UserError(f"the environment sets {', '.join(present)} but not a consistent torchrun set "
                        f"({', '.join(missing) if missing else f'RANK={rank} of WORLD_SIZE={world}'}): start data "
                        f"parallel runs with torchrun, or unset {', '.join(present)}")
    return True


class Processes:
    def __init__(self, config):
        self.ddp = under_torchrun()
        self.rank, self.world_size = 0, 1
        self.device = pick_device(config["device"])
        if self.ddp:
            import torch.distributed as dist
            self.dist = dist
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            if self.device.startswith("cuda"):
                self.device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
                torch.cuda.set_device(self.device)  # NCCL's object collectives use the current device
        self.master = self.rank == 0  # the process that evaluates, logs and writes

    def micro_steps(self, gradient_accumulation_steps):
        """Each process's share of the accumulation steps (the batch of one optimisation step is split)."""
        if gradient_accumulation_steps % self.world_size:
            multiple = self.world_size * -(-gradient_accumulation_steps // self.world_size)
            raise UserError(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by the "
                            f"{self.world_size} processes: pass --gradient_accumulation_steps={multiple}")
        return gradient_accumulation_steps // self.world_size

    def identical(self, model):
        """Do all processes hold the same weights? (The proof that gradients were averaged.)"""
        checksums = self.gather(torch.stack([p.detach().double().sum() for p in model.parameters()]).cpu())
        return all(torch.equal(checksums[0], c) for c in checksums)

    def wrap(self, model):
        if not self.ddp:
            return model
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[int(os.environ["LOCAL_RANK"])]
                                       if self.device.startswith("cuda") else None)

    def sum(self, values):
        """Element-wise sum of a list of floats over the processes."""
        if not self.ddp:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor)
        return tensor.tolist()

    def minimum(self, value):
        if not self.ddp:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MIN)
        return tensor.item()

    def from_master(self, values):
        """The master's list of (picklable) values, on every process."""
        if not self.ddp:
            return values
        values = list(values)
        self.dist.broadcast_object_list(values, src=0)
        return values

    def gather(self, value):
        """[value of process 0, value of process 1, ...] on every process."""
        if not self.ddp:
            return [value]
        gathered = [None] * self.world_size
        self.dist.all_gather_object(gathered, value)
        return gathered

    def master_first(self, work):
        """Run `work` on the master first (e.g. preparing the dataset), then on the others."""
        if self.ddp and not self.master:
            self.dist.barrier()
        try:
            return work()
        finally:
            if self.ddp and self.master:
                self.dist.barrier()

    def master_only(self, work):
        """Run `work` on the master; a UserError there is raised on every process (rather than leaving the
        others waiting for it forever)."""
        result, error = None, None
        if self.master:
            try:
                result = work()
            except UserError as e:
                error = str(e)
        (error,) = self.from_master([error])
        if error:
            raise UserError(error)
        return result


def peer_lost_line(error):
    """One line for a collective that failed because another process of the job died (killed, or failed without
    reaching the collective), else None: gloo raises a RuntimeError naming the closed connection."""
    text = str(error)
    if not any(cue in text for cue in ("Connection reset by peer", "Connection closed by peer", "Broken pipe")):
        return None
    return (f"process {os.environ.get('RANK', '?')}: another process of the job stopped answering (ended or was "
            f"killed); this one stops too, its last checkpoint kept")


def run_under_torchrun(config, run):
    """One process of a torchrun job: join the process group, run(), and leave through os._exit whatever the
    ending, finished or failed: gloo's transport threads can be destroyed still running in the interpreter's C++
    teardown (SIGABRT, exit status 134; docs/reliability.md). run() must have closed its files by then."""
    import gc
    import signal
    import sys
    import traceback
    from torch.distributed import destroy_process_group
    join_process_group(config)
    status = 0
    try:
        run()
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException:  # not one of ours: show it, as Python would, then leave the same way
        traceback.print_exc()
        status = 1
    for sig in (signal.SIGINT, signal.SIGTERM):  # asked to stop while leaving (torchrun stops the others when one
        signal.signal(sig, lambda *_: os._exit(status))  # fails): no second message, the status already decided
    gc.collect()  # the DDP wrapper holds the process group: free it while the interpreter is whole
    destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def join_process_group(config, give_up_after=120.0):
    """init_process_group waits in C++ for every process of the job (half an hour by default) and hears no signal
    meanwhile. Here the wait is bounded and talks: after a few seconds a line says what it waits for, after
    give_up_after seconds one line ends the process (status 1), and a Ctrl-C or SIGTERM ends it at once (nothing
    has been done yet that could be kept)."""
    import signal
    import sys
    import threading
    from torch.distributed import init_process_group
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    world, rank = os.environ["WORLD_SIZE"], os.environ["RANK"]

    def waiting():
        print(f"process {rank}: waiting for all {world} processes of the job to meet at {where} (up to "
              f"{give_up_after:.0f} s)", file=sys.stderr, flush=True)

    def give_up():
        print(f"train.py: error: process {rank}: the {world} processes did not all meet at {where} within "
              f"{give_up_after:.0f} s: start every process together (torchrun --nproc_per_node={world} ...)",
              file=sys.stderr, flush=True)
        os._exit(1)

    timers = [threading.Timer(5.0, waiting), threading.Timer(give_up_after, give_up)]
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGINT, signal.SIGTERM)}
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        init_process_group(backend="nccl" if torch.cuda.is_available() and config["device"] != "cpu" else "gloo")
    finally:
        for timer in timers:
            timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_launch(args):
    """torchrun's own arguments that it would meet with a traceback (or, for restarts, with a second run that
    does not resume the first): refused here in one line, before any process starts."""
    n = str(args.nproc_per_node)
    if n in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(f"--nproc_per_node={n}: this machine has no CUDA device; give the number of processes "
                        f"(on CPUs they talk through gloo)")
    if n not in ("gpu", "cuda", "cpu", "auto") and not (n.isdigit() and int(n) >= 1):
        raise UserError(f"--nproc_per_node={n}: the number of processes, a whole number >= 1 (or auto, cpu, gpu)")
    nodes = str(args.nnodes).split(":")
    if len(nodes) > 2 or not all(part.isdigit() and int(part) >= 1 for part in nodes):
        raise UserError(f"--nnodes={args.nnodes}: the number of machines, a whole number >= 1 (or MIN:MAX)")
    if args.max_restarts:
        raise UserError(f"--max-restarts={args.max_restarts}: a restarted train.py starts a fresh run, it does not "
                        f"resume the checkpoint; leave it at 0 and continue with train.py's --init_from=resume")
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    if int(nodes[-1]) > 1 and endpoint.rpartition(":")[2] == "0":  # (torchrun would wait for the others, silent)
        raise UserError(f"--rdzv_endpoint={endpoint}: port 0 means any free port, which the other machines cannot "
                        f"know to meet on; give the port every machine uses (for example {endpoint[:-2]}:29500)")


def launch(argv):
    """torchrun itself (torch.distributed.run, the same arguments), ending the way train.py ends: when a process
    fails, the command exits with that process's status after the one line it printed, instead of torchrun's
    ChildFailedError traceback and failure table. A process killed by a signal gets a line here (exit 128 + signal).

        python -m infra.parallel --standalone --nproc_per_node=2 train.py --gradient_accumulation_steps=2"""
    import logging
    import signal
    import sys
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run
    for name in list(logging.root.manager.loggerDict):  # its per-process failure lines (each logger has a level)
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    args = parse_args(argv)
    check_launch(args)
    for other in (signal.SIGUSR1, signal.SIGUSR2):  # their default would end this launcher alone and leave the
        signal.signal(other, lambda *_: os.kill(os.getpid(), signal.SIGTERM))  # processes training: stop them all
    try:
        run(args)
    except ChildFailedError as e:
        # the root cause: a process killed outright (not by torchrun's SIGTERM to the others), else the first to
        # end; the timestamps are whole seconds, so a killed process and its peer's reaction can tie
        killed = [(r, f) for r, f in sorted(e.failures.items()) if f.exitcode < 0 and f.exitcode != -signal.SIGTERM]
        rank, failure = killed[0] if killed else e.get_first_failure()
        if failure.exitcode > 0:
            return failure.exitcode  # 2 usage, 1 failure, 130 stopped: that process has said why in one line
        name = signal.Signals(-failure.exitcode).name
        print(f"{os.path.basename(e.name)}: process {rank} was killed by {name}", file=sys.stderr)
        return 128 - failure.exitcode
    except SignalException as e:  # torchrun has passed the signal on and waited for the processes (up to its
        # --shutdown-timeout), which on Ctrl-C or SIGTERM save a checkpoint and say so: 130, as train.py's status
        return 130 if e.sigval in (signal.SIGINT, signal.SIGTERM) else 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    import sys
    try:
        sys.exit(launch(sys.argv[1:]))
    except UserError as e:  # (not run_main: torchrun installs its own signal handling)
        print(f"python -m infra.parallel: error: {e}", file=sys.stderr)
        sys.exit(2)
