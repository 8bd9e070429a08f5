"""cc_library from .proto files with Debian's protoc and grpc_cpp_plugin (offline).

    ferry_cc_proto(name = "ferry_cc_proto", srcs = ["ferry.proto"], grpc = True)

generates <name>.pb.{h,cc} (and .grpc.pb.{h,cc}) next to the sources, included as
"proto/ferry/v1/ferry.pb.h". `deps` are other ferry_cc_proto targets whose protos are
imported.
"""

def ferry_cc_proto(name, srcs, deps = [], grpc = False, visibility = None):
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    pkg = native.package_name()
    dep_protos = [d + "_protos" for d in deps]
    native.filegroup(name = name + "_protos", srcs = srcs + dep_protos, visibility = visibility)
    cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR)"
    cmd += " " + " ".join([pkg + "/" + s for s in srcs])
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos,
        outs = outs,
        cmd = cmd,
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system_grpc//:lib"],
        visibility = visibility,
    )
