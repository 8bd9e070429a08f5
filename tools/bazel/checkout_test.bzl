"""checkout_test: a Bazel test of a script that drives ferry from outside C++.

    checkout_test(
        name = "pytest",
        script = "//tools:pytest.sh",
        binaries = {"FERRYD": "//agent/main:ferryd"},  # built as data, paths in these variables
    )

The script reads what the checkout has beside Bazel's graph: its sources as a whole, the
.venv, helm and Go from tools/setup.sh, podman, network namespaces as root. It finds the
checkout through its own path (`readlink -f "$0"`: the runfiles link back to it) and
builds nothing itself (Bazel is busy running it); run by hand, the same script builds what
it needs. Hence the tags, decided here once:
  manual     `bazel test //...` leaves it out; tools/test.sh names it
  local      no sandbox: it reads the checkout and runs as the invoking user
  external   never cached: Bazel cannot see those inputs
  exclusive  runs alone, not beside the C++ suites on a 2-core machine (unless exclusive = False)
  integration  unless integration = False: it is in tools/test.sh's integration tier
HOME is passed through (pip's, Go's and the vLLM venv's caches live under it).
"""

def checkout_test(
        name,
        script,
        binaries = {},
        data = [],
        args = [],
        timeout = "long",
        integration = True,
        exclusive = True):
    tags = ["external", "local", "manual"]
    if exclusive:
        tags.append("exclusive")
    if integration:
        tags.append("integration")
    native.sh_test(
        name = name,
        srcs = [script],
        args = args,
        data = data + list(binaries.values()),
        env = {var: "$(rootpath %s)" % label for var, label in binaries.items()},
        env_inherit = ["HOME"],
        timeout = timeout,
        tags = sorted(tags),
    )
