"""The defaults agent/README.md states for ferryd's flags are the binary's own: every flag
a table row names exists, and where a row gives a value (a number with or without a
binary unit, 2^N, true / false, a quoted string) it is the default `ferryd --helpfull`
prints. A flag's default is decided in one place (agent/main/ferryd.cc); this keeps the
page that documents it from drifting."""
import os
import re
import subprocess
import unittest

RUNFILES = os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def binary_defaults():
    out = subprocess.run([os.path.join(RUNFILES, "agent/main/ferryd"), "--helpfull"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    starts = list(re.finditer(r"^\s+--(\w+) \(", text, re.M))
    out = {}
    for m, end in zip(starts, [n.start() for n in starts[1:]] + [len(text)]):
        found = re.findall(r"default: (.*?);\s*$", text[m.start():end], re.M)
        if found:
            out[m.group(1)] = found[-1]
    return out


def normalized(value):
    """A README cell's value as --helpfull prints it, or None when it is prose."""
    v = value.strip().strip("`")
    if value.strip().startswith("`"):  # a string flag's value, as written
        return f'"{v}"' if re.fullmatch(r"[\w./:;=,-]+", v) else None
    if m := re.fullmatch(r"(\d+) (KiB|MiB|GiB|TiB)", v):
        return str(int(m.group(1)) * UNITS[m.group(2)])
    if m := re.fullmatch(r"2\^(\d+)", v):
        return str(1 << int(m.group(1)))
    if re.fullmatch(r"\d+|true|false", v):
        return v
    return None


class FlagTableTest(unittest.TestCase):
    def test_every_documented_default_is_the_binarys(self):
        defaults = binary_defaults()
        self.assertIn("max_sessions", defaults, "could not read ferryd --helpfull")
        with open(os.path.join(RUNFILES, "agent/README.md")) as f:
            rows = [line for line in f if line.startswith("| `--")]
        checked = 0
        for row in rows:
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            flags = re.findall(r"`--(\w+)`", cells[0])
            if not flags or "*" in cells[0]:
                continue
            values = [v for v in re.split(r",\s*|;\s*", cells[1])] if len(flags) > 1 else [cells[1]]
            for flag in flags:
                self.assertIn(flag, defaults, f"agent/README.md documents --{flag}, which ferryd lacks")
            if len(values) != len(flags):
                continue
            for flag, value in zip(flags, values):
                want = normalized(value)
                if want is not None:
                    self.assertEqual(defaults[flag], want, f"--{flag}: agent/README.md says {value!r}")
                    checked += 1
        self.assertGreater(checked, 30)


if __name__ == "__main__":
    unittest.main()
