"""A ferryd for the Python benchmarks (tools/bench/py_*.py): one agent on a unix socket
in a fresh /tmp folder, started and stopped around a block.

    with local_agent(args.ferryd, "fy.pb.") as (sock, work):
        ...
"""
import contextlib
import os
import subprocess
import tempfile
import time


def wait_for(path, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {seconds} s")
        time.sleep(0.05)


@contextlib.contextmanager
def local_agent(ferryd, prefix):
    work = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    sock = f"{work}/a.sock"
    agent = subprocess.Popen([ferryd, f"--socket={sock}", "--metrics_address=127.0.0.1:0",
                              f"--ready_file={work}/ready", "--log_level=warning"])
    try:
        wait_for(f"{work}/ready")
        yield sock, work
    finally:
        agent.terminate()
        agent.wait(15)
