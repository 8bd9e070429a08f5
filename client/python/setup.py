"""Generates ferry/_proto from proto/ferry/v1/ferry.proto while building the package.

The stubs are made by grpcio-tools (a build requirement in pyproject.toml), so the
package always matches the agent's API in this tree; nothing generated is committed.
"""
import pathlib
import re

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
PROTO_DIR = HERE.parent.parent / "proto" / "ferry" / "v1"
OUT = HERE / "ferry" / "_proto"


def generate():
    import grpc_tools
    from grpc_tools import protoc  # build requirement

    if not (PROTO_DIR / "ferry.proto").exists():
        raise SystemExit(f"ferry: {PROTO_DIR}/ferry.proto not found; build from a ferry checkout "
                         "(pip install ./client/python)")
    OUT.mkdir(exist_ok=True)
    (OUT / "__init__.py").write_text('"""Generated from proto/ferry/v1/ferry.proto at build time."""\n')
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={OUT}", f"--pyi_out={OUT}",
                      f"--grpc_python_out={OUT}", str(PROTO_DIR / "ferry.proto")])
    if rc != 0:
        raise SystemExit("ferry: protoc failed on ferry.proto")
    # The plugin writes a top-level import; make it relative to the package.
    grpc_file = OUT / "ferry_pb2_grpc.py"
    grpc_file.write_text(re.sub(r"^import ferry_pb2 as", "from . import ferry_pb2 as", grpc_file.read_text(),
                                flags=re.M))


# Before setup(): setuptools checks that every listed package directory exists.
generate()
setup()
