"""The examples in client/examples run as a new user would run them."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_host_transfer_example(agent):
    out = subprocess.run([sys.executable, str(EXAMPLES / "host_transfer.py"), agent.socket], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "data matches" in out.stdout


def test_kv_transfer_example_on_gpus(agent):
    torch = pytest.importorskip("torch", reason="SKIPPED (needs PyTorch with CUDA)")
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED (needs a GPU)")
    out = subprocess.run([sys.executable, str(EXAMPLES / "kv_transfer_torch.py"), agent.socket], capture_output=True,
                         text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every block matches" in out.stdout
