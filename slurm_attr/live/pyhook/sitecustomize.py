"""slurm-attr's opt-in start-up hook: torch's worker server in every torch process.

The SPANK plugin puts this directory first on PYTHONPATH, and sets
TORCH_WORKER_SERVER_SOCKET to a per-rank path in the job's evidence dir, only where the
site opted in (plugstack ``worker_hook=``, and ``live_partitions=`` when set). Python imports ``sitecustomize`` at start;
this one imports nothing heavy: it waits for the program itself to import
``torch.distributed`` (a process that never uses torch never loads it), then starts
``torch._C._distributed_c10d._WorkerServer(path)`` so the node's live watcher can ask the
rank for its Flight Recorder (``fr_trace_json``) and its stacks (``dump_traceback``)
while a hang lasts. Then it runs the sitecustomize this one shadows, if any.

It must never change what the program does: every failure is swallowed, it starts at
most one server per process, and a child process (fork or spawn) that inherits the
variable does not take its parent's socket.
Stdlib only: the job's Python is not slurm-attr's.
"""
import os
import sys

_VAR = "TORCH_WORKER_SERVER_SOCKET"
_OWNER = "SLURM_ATTR_WS_OWNER"  # "<pid>:<path>" of the process serving that path
_server = None


def _socket_path():
    path = os.environ.get(_VAR, "")
    if not path.startswith("/"):
        return None
    rank = os.environ.get("RANK", "")
    if rank.isdigit():
        # a launcher (torchrun) runs several ranks in one Slurm task: one socket each
        path = os.path.join(os.path.dirname(path), "rank_%s.sock" % rank)
    return path


def _launcher():
    """torchrun's agent process is not a rank: its workers get the sockets."""
    arg0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(arg0) == "torchrun" or arg0.endswith(
        ("distributed/run.py", "distributed/launch.py"))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _start():
    global _server
    path = _socket_path()
    if _server is not None or path is None or _launcher():
        return
    owner = os.environ.get(_OWNER, "")
    pid, _, opath = owner.partition(":")
    if opath == path and pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
        return  # a DataLoader worker or other child of the rank: the parent serves
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # left by an earlier process of this job (its owner is gone)
        # torch's one public way to this server, control_plane.worker_main(), is wrapped in
        # elastic's @record, which turns on faulthandler for all threads: a change in what the
        # program does on a crash. The class is private to torch, so the tests that need its
        # answers start it through this hook with the torch `make test` installs
        # (tests/unit/test_live_dumps_hook.py, tests/integration/test_live_dumps.py, test_live_plugin.py).
        from torch._C._distributed_c10d import _WorkerServer

        _server = _WorkerServer(path)
        os.environ[_OWNER] = "%d:%s" % (os.getpid(), path)
        import atexit

        atexit.register(_stop)
    except Exception:  # noqa: BLE001 - the program runs as without the hook
        _server = None


def _stop():
    global _server
    s, _server = _server, None
    try:
        if s is not None:
            s.shutdown()
    except Exception:  # noqa: BLE001
        pass


class _AfterTorchDistributed:
    """A meta-path finder that only wraps torch.distributed's loader: when that module has
    run, the server starts (torch._C is loaded by then)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch.distributed":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _start()

        loader.exec_module = exec_module
        return spec


def _chain():
    """Run the sitecustomize this one shadows (the next one on sys.path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec

        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(module_from_spec(spec))
    except Exception:  # noqa: BLE001 - theirs failing is theirs; ours must not add to it
        pass


if os.environ.get(_VAR):
    if "torch.distributed" in sys.modules:
        _start()
    else:
        sys.meta_path.insert(0, _AfterTorchDistributed())
_chain()
