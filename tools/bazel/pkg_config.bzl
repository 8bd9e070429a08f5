"""A repository rule that wraps a system library found by pkg-config as a cc_library.

Usage (WORKSPACE):
    pkg_config_library(name = "system_grpc", modules = ["grpc++", "protobuf"])
then depend on "@system_grpc//:lib".

Headers stay in /usr/include (already on the compiler's path); the rule only carries
the link options and defines that pkg-config reports, so inline Abseil symbols used by
gRPC's headers resolve against the same Abseil build.
"""

def _run(ctx, args):
    result = ctx.execute(["pkg-config"] + args)
    if result.return_code != 0:
        fail("pkg-config %s failed (run tools/setup.sh to install the system packages): %s" %
             (" ".join(args), result.stderr))
    return [f for f in result.stdout.strip().replace("\n", " ").split(" ") if f]

def _pkg_config_library_impl(ctx):
    cflags = _run(ctx, ["--cflags"] + ctx.attr.modules)
    libs = _run(ctx, ["--libs"] + ctx.attr.modules)
    defines = [f[2:] for f in cflags if f.startswith("-D")]
    copts = [f for f in cflags if not f.startswith("-D") and not f.startswith("-I/usr/include")]
    ctx.file("BUILD", """
cc_library(
    name = "lib",
    defines = {defines},
    copts = {copts},
    linkopts = {linkopts},
    visibility = ["//visibility:public"],
)
""".format(defines = repr(defines), copts = repr(copts), linkopts = repr(libs)))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {"modules": attr.string_list(mandatory = True)},
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
