"""Alternating A/B runs of mqbench against deploy/local (plain) and
deploy/local-secure (TLS, mutual TLS between members, signed calls), both
running from the repository root with release binaries (docs/benchmarks.md,
"Issue 20: the cost of TLS and authentication"); SecureTopic (8 queues, as
`--create` makes BenchTopic) and SecureGroup made with mqadmin first. Prints each run's summary (also in /tmp/<name>-<round>.json)
with the three brokers' CPU seconds (from /proc) and mqbench's.

    python3 bench/scripts/tls_ab.py [ROUNDS [SECONDS]]
"""
import json, os, resource, subprocess, sys, time
R = "target/release/mqbench"
CA = "deploy/local-secure/certs/ca.pem"
TICK = os.sysconf("SC_CLK_TCK")
cfgs = {
    "plain": (["--endpoints", "127.0.0.1:8081,127.0.0.1:8082,127.0.0.1:8083", "--create",
               "--queues", "8"], "deploy/local/n"),
    "tls+auth": (["--endpoints", "127.0.0.1:8181,127.0.0.1:8182,127.0.0.1:8183", "--tls-ca", CA,
                  "--access-key", "demo", "--secret-key", "demo-secret",
                  "--topic", "SecureTopic", "--group", "SecureGroup"], "deploy/local-secure/n"),
}
def pids(marker):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "mqbroker" in cmd and marker in cmd:
                out.append(p)
    return out
def cpu(ps):
    t = 0
    for p in ps:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        t += int(f[11]) + int(f[12])
    return t / TICK
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
secs = sys.argv[2] if len(sys.argv) > 2 else "20"
rows = []
for r in range(rounds):
    for name, (args, marker) in cfgs.items():
        ps = pids(marker)
        assert len(ps) == 3, (name, ps)
        c0 = cpu(ps); ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        js = f"/tmp/{name}-{r}.json"
        subprocess.run([R, *args, "--window", "128", "--duration-secs", secs, "--warmup-secs", "2", "--json", js],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c1 = cpu(ps); ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s = json.load(open(js))
        rows.append((name, r, s, c1 - c0, (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)))
        print(name, r, json.dumps(s)[:400], "broker_cpu_s", round(c1 - c0, 2), "client_cpu_s", round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 2), flush=True)

# The table of docs/benchmarks.md: per run, then the means per configuration.
print("config round msgs/s send_p99_ms broker_us/msg client_us/msg")
means = {}
for name, r, s, broker, client in rows:
    row = (s["send_msgs_per_s"], s["send_latency_ms"]["p99"],
           broker / s["acked"] * 1e6, client / s["acked"] * 1e6)
    means.setdefault(name, []).append(row)
    print(name, r + 1, *("%.1f" % v for v in row))
for name, rs in means.items():
    print(name, "mean", *("%.1f" % (sum(col) / len(col)) for col in zip(*rs)))
