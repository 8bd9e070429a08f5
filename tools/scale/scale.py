"""The scale and churn harness behind `tools/scale.sh`.

N agents, each in its own network namespace with one veth on one bridge, a pod process
on each (tools/scale/scale_pod.cc) writing random checksummed blocks to the pods of the
other agents, all to all. Every --churn_s seconds one of: an agent SIGKILLed with its pod
and restarted (a node replaced), a pod SIGKILLed and started again (a pod crash), or an
agent that was not yet up joins (the run starts with N - N/8 agents). Samples every
agent's RSS, fds, threads, peers and metric series; reads the pods' logs at the end.

Prints a report and exits 1 when a write was lost (its writer saw it done, its receiver
pod, alive, never heard of it), corrupted, or hung (no result in 15 s), or when an
agent died that the harness did not kill.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


BACKLOG = "/proc/sys/net/core/netdev_max_backlog"


class Network:
    """One bridge in the root namespace; agent i at 10.78.<i/250>.<i%250+1> in namespace <tag>h<i>.

    Packets between veths wait in the kernel's per-CPU backlog, 1,000 packets by default:
    an ARP broadcast alone is 64 packets on a 64-port bridge, and with all-to-all traffic
    the backlog overflowed (SYNs and ARP requests dropped, connections taking seconds).
    A real NIC has its own rings; the run raises the backlog and puts it back at the end.
    Each namespace also gets every other's address resolved for good (static neighbour
    entries): with 64 ports, ARP requests went unanswered for seconds at a time (a plain
    TCP connect between two namespaces, no agent involved, took 3-6 s), which would be
    measured as the agents' first contact.
    """

    def __init__(self, n, tag):
        self.tag, self.n = tag, n
        self.backlog = open(BACKLOG).read().strip()
        with open(BACKLOG, "w") as f:
            f.write("16384")
        self.bridge = f"{tag}br"
        sh(f"ip link add {self.bridge} type bridge && ip addr add 10.78.255.254/16 dev {self.bridge} "
           f"&& ip link set {self.bridge} up")
        script = []
        for i in range(n):
            ns, outer = f"{tag}h{i}", f"{tag}v{i}"
            script += [f"ip netns add {ns}", f"ip -n {ns} link set lo up",
                       f"ip link add {outer} type veth peer name eth0 netns {ns}",
                       f"ip link set {outer} master {self.bridge} up",
                       f"ip -n {ns} addr add {self.address(i)}/16 dev eth0", f"ip -n {ns} link set eth0 up"]
        sh(" && ".join(script))
        macs = []
        for i in range(n):
            out = subprocess.run(["ip", "-n", f"{tag}h{i}", "-br", "link", "show", "eth0"], check=True,
                                 capture_output=True, text=True).stdout.split()
            macs.append(out[2])
        for i in range(n):
            batch = "".join(f"neigh replace {self.address(j)} lladdr {macs[j]} dev eth0 nud permanent\n"
                            for j in range(n) if j != i)
            subprocess.run(["ip", "-n", f"{tag}h{i}", "-batch", "-"], input=batch, text=True, check=True)

    def address(self, i):
        return f"10.78.{i // 250}.{i % 250 + 1}"

    def close(self):
        for i in range(self.n):
            subprocess.run(f"ip netns del {self.tag}h{i}", shell=True, stderr=subprocess.DEVNULL)
        subprocess.run(f"ip link del {self.bridge}", shell=True, stderr=subprocess.DEVNULL)
        with open(BACKLOG, "w") as f:
            f.write(self.backlog)


class Run:
    def __init__(self, args):
        self.args = args
        self.dir = args.dir
        for sub in ("desc", "log", "agents"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.net = Network(args.agents, f"fs{os.getpid() % 100000}")
        self.agents = {}  # i -> Popen
        self.pods = {}  # i -> (Popen, generation)
        self.generation = {}
        self.events = []  # (t, kind, i)
        self.samples = []  # (t, i, rss_kb, fds, threads, peers_connected, series)
        self.unexpected_deaths = []
        self.heal = []  # (restart time, agent, key)

    def start_agent(self, i):
        ip = self.net.address(i)
        ready = os.path.join(self.dir, "agents", f"{i}.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        log = open(os.path.join(self.dir, "agents", f"{i}.log"), "ab")
        self.agents[i] = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.net.tag}h{i}", self.args.ferryd,
             f"--socket={self.dir}/agents/{i}.sock", f"--peer_address={ip}:7000", "--fabric_iface=eth0",
             "--fabric_provider=tcp;ofi_rxm", f"--metrics_address={ip}:9464", f"--ready_file={ready}",
             "--log_level=warning", "--fabric_spin_us=0", "--local_copy_threads=1"] + self.args.ferryd_flag,
            stdout=log, stderr=log)
        deadline = time.time() + 60
        while not os.path.exists(ready):
            if self.agents[i].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"agent {i} did not start; see {self.dir}/agents/{i}.log")
            time.sleep(0.05)

    def start_pod(self, i, seconds_left):
        g = self.generation.get(i, -1) + 1
        self.generation[i] = g
        log = open(os.path.join(self.dir, "log", f"{i}.{g}.err"), "ab")
        p = subprocess.Popen(
            [self.args.pod, f"--socket={self.dir}/agents/{i}.sock", f"--dir={self.dir}", f"--agent={i}",
             f"--generation={g}", f"--agents={self.args.agents}", f"--seconds={int(seconds_left)}",
             f"--interval_ms={self.args.interval_ms}"], stdout=log, stderr=log)
        self.pods[i] = (p, g)
        return f"{i}.{g}"

    def kill_pod(self, i):
        p, g = self.pods.pop(i)
        try:
            os.unlink(os.path.join(self.dir, "desc", f"{i}.{g}"))
        except FileNotFoundError:
            pass
        p.send_signal(signal.SIGKILL)
        p.wait()

    def kill_agent(self, i):
        a = self.agents.pop(i)
        a.send_signal(signal.SIGKILL)
        a.wait()

    def sample(self, t):
        for i, a in list(self.agents.items()):
            if a.poll() is not None:
                self.unexpected_deaths.append((t, i, a.returncode))
                del self.agents[i]
                continue
            pid = a.pid  # `ip netns exec` execs the agent: the child is ferryd itself
            try:
                status = open(f"/proc/{pid}/status").read()
                rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
                threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                text = urllib.request.urlopen(f"http://{self.net.address(i)}:9464/metrics", timeout=5).read().decode()
            except Exception:  # it died between the check and here
                continue
            series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            m = re.search(r'^ferry_peers\{state="connected"\} (\S+)', text, re.M)
            self.samples.append((t, i, rss, fds, threads, float(m.group(1)) if m else 0.0, series))

    def churn(self, t, seconds_left):
        not_up = [i for i in range(self.args.agents) if i not in self.agents]
        action = random.choice(["restart", "pod"] + (["join"] if not_up else []))
        if action == "join":
            i = random.choice(not_up)
            self.start_agent(i)
            key = self.start_pod(i, seconds_left)
            self.heal.append((time.time(), i, key))
        elif action == "restart":
            i = random.choice(list(self.agents))
            self.kill_pod(i)
            self.kill_agent(i)
            time.sleep(1)
            t0 = time.time()
            self.start_agent(i)
            key = self.start_pod(i, seconds_left)
            self.heal.append((t0, i, key))
        else:
            i = random.choice(list(self.pods))
            self.kill_pod(i)
            self.start_pod(i, seconds_left)
        self.events.append((t, action, i))

    def run(self):
        a = self.args
        seconds = a.minutes * 60
        first = a.agents - a.agents // 8
        for i in range(first):
            self.start_agent(i)
        start = time.time()
        for i in range(first):
            self.start_pod(i, seconds + 5)
        next_sample, next_churn = start, start + a.churn_s
        while time.time() < start + seconds:
            now = time.time()
            if now >= next_sample:
                self.sample(now - start)
                next_sample += a.sample_s
            if now >= next_churn:
                self.churn(now - start, start + seconds + 5 - now)
                next_churn += a.churn_s
            time.sleep(0.2)
        self.sample(time.time() - start)
        for p, _ in self.pods.values():
            p.send_signal(signal.SIGTERM)
        for p, _ in self.pods.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for i, ag in self.agents.items():
            if ag.poll() is not None:
                self.unexpected_deaths.append((time.time() - start, i, ag.returncode))
            ag.send_signal(signal.SIGTERM)
        for ag in self.agents.values():
            try:
                ag.wait(timeout=30)
            except subprocess.TimeoutExpired:
                ag.kill()
        return start


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def report(run, start):
    a = run.args
    logs = os.path.join(run.dir, "log")
    sent, hung, failed_codes = [], 0, {}
    received = {}  # receiver key -> {(writer key, seq): verdict}
    recv_end = {}  # receiver key -> time of its last log line (ms)
    for name in os.listdir(logs):
        key, kind = name.rsplit(".", 1)
        path = os.path.join(logs, name)
        if kind == "sent":
            for line in open(path):
                f = line.split()
                if f[1] == "hung":
                    hung += 1
                elif f[1] == "sent":
                    code = int(f[4])
                    if code == 0:
                        sent.append((int(f[0]), key, f[2], int(f[3]), int(f[5]), "first" in f[6:]))
                    else:
                        failed_codes[code] = failed_codes.get(code, 0) + 1
        elif kind == "recv":
            got = received.setdefault(key, {})
            for line in open(path):
                f = line.split()
                recv_end[key] = int(f[0])
                if f[1] in ("ok", "corrupt", "replaced"):
                    got[(f[2], int(f[3]))] = f[1]
    # Pods that ended (killed, or the run's end): a write to one whose log stops within
    # 3 s of the write may have been in its queue when it died; it is not lost.
    verdicts, lost, unverifiable = {}, [], 0
    for t_ms, writer, target, seq, _, _ in sent:
        v = received.get(target, {}).get((writer, seq))
        if v is None:
            if recv_end.get(target, 0) < t_ms + 3000:
                unverifiable += 1
            else:
                lost.append((writer, target, seq))
            continue
        verdicts[v] = verdicts.get(v, 0) + 1
    corrupt = verdicts.get("corrupt", 0)
    firsts = [ms for _, _, _, _, ms, first in sent if first]
    heals = []
    for t0, i, key in run.heal:  # first write from another pod into the new pod that was done
        done = [t_ms for t_ms, writer, target, _, ms, _ in sent if target == key]
        if done:
            heals.append(min(done) / 1000 - t0)
    # Per agent, over the agents never restarted: RSS, fds after warm-up vs at the end.
    restarted = {i for _, kind, i in run.events if kind in ("restart", "join")}
    warm_t = a.minutes * 60 / 3  # by then each pod has written to most others
    per_agent = {}
    for t, i, rss, fds, threads, peers, series in run.samples:
        per_agent.setdefault(i, []).append((t, rss, fds, threads, peers, series))
    growth_rss, growth_fds = [], []
    for i, s in per_agent.items():
        if i in restarted:
            continue
        warm = [x for x in s if x[0] >= warm_t]
        if len(warm) < 2:
            continue
        growth_rss.append(warm[-1][1] / warm[0][1] - 1)
        growth_fds.append(warm[-1][2] / warm[0][2] - 1)
    by_time = {}
    for t, i, rss, *_ in run.samples:
        by_time.setdefault(round(t), 0)
        by_time[round(t)] += rss
    total_rss_gib = max(by_time.values()) / 2**20 if by_time else 0
    peers_max = max((x[5] for x in run.samples), default=0)
    series_max = max((x[6] for x in run.samples), default=0)
    threads_max = max((x[4] for x in run.samples), default=0)
    fds_max = max((x[3] for x in run.samples), default=0)
    rss_max = max((x[2] for x in run.samples), default=0)
    kinds = {}
    for _, kind, _ in run.events:
        kinds[kind] = kinds.get(kind, 0) + 1

    out = []
    out.append(f"# ferry scale  {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}  {a.agents} agents "
               f"(network namespaces, one bridge, static neighbours; netdev_max_backlog 16384), {a.minutes} min, "
               f"churn every {a.churn_s} s, {os.cpu_count()} CPUs")
    out.append(f"churn: {kinds.get('restart', 0)} agent restarts (SIGKILL, with their pods), "
               f"{kinds.get('pod', 0)} pod crashes (SIGKILL), {kinds.get('join', 0)} agents joined")
    out.append(f"writes done {len(sent)}, failed cleanly {sum(failed_codes.values())} "
               f"(by code {dict(sorted(failed_codes.items()))}), hung {hung}")
    out.append(f"receivers: verified {verdicts.get('ok', 0)}, corrupt {corrupt}, replaced before checked "
               f"{verdicts.get('replaced', 0)}, lost {len(lost)}, receiver ended within 3 s {unverifiable}")
    out.append(f"first write to a new pod: n={len(firsts)} p50 {percentile(firsts, 0.5):.0f} ms "
               f"p99 {percentile(firsts, 0.99):.0f} ms")
    if heals:
        out.append(f"heal after a restart or join (first write into the new pod done): n={len(heals)} "
                   f"p50 {percentile(heals, 0.5):.2f} s max {max(heals):.2f} s")
    if growth_rss:
        out.append(f"agents never restarted ({len(growth_rss)}): RSS after {warm_t:.0f} s to the end "
                   f"{min(growth_rss) * 100:+.1f} % .. {max(growth_rss) * 100:+.1f} %, fds "
                   f"{min(growth_fds) * 100:+.1f} % .. {max(growth_fds) * 100:+.1f} %")
    out.append(f"per agent at most: RSS {rss_max / 1024:.0f} MiB, fds {fds_max}, threads {threads_max}, "
               f"peers connected {peers_max:.0f}, metric series {series_max}")
    out.append(f"all agents together at most: RSS {total_rss_gib:.2f} GiB")
    if run.unexpected_deaths:
        out.append(f"AGENTS DIED unexpectedly: {run.unexpected_deaths}")
    for w, t, s in lost[:10]:
        out.append(f"LOST: {w} -> {t} seq {s}")
    print("\n".join(out))
    with open(os.path.join(run.dir, "report.json"), "w") as f:
        json.dump({"samples": run.samples, "events": run.events, "firsts": firsts, "heals": heals}, f)
    return 0 if not lost and corrupt == 0 and hung == 0 and not run.unexpected_deaths else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--churn_s", type=float, default=5)
    p.add_argument("--sample_s", type=float, default=10)
    p.add_argument("--interval_ms", type=int, default=500)
    p.add_argument("--ferryd", required=True)
    p.add_argument("--pod", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--ferryd_flag", action="append", default=[])
    args = p.parse_args()
    random.seed(os.getpid())
    run = Run(args)
    try:
        start = run.run()
    finally:
        for p_, _ in list(run.pods.values()):
            p_.kill()
        for ag in list(run.agents.values()):
            ag.kill()
        run.net.close()
    sys.exit(report(run, start))


if __name__ == "__main__":
    main()
