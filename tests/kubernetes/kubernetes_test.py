#!/usr/bin/env python3
"""The pods of examples/kubernetes/ as local processes, under exactly the environment that
Kubeflow's operators give them (no Kubernetes cluster is available here). The command lines
and the containers' env are read from the manifests themselves, so the test checks the files:

  1. pytorchjob.yaml: the master and every worker started with the training operator's
     MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and PYTHONUNBUFFERED (and nothing inherited
     from this process); the master's weights must equal those of `kolo run -n N` of the same
     command;
  2. the same job whose worker 1 (rank 2) is killed with SIGKILL once it holds its connection
     to the master's store: the others must end, with an error that names rank 2;
  3. pytorchjob_ps.yaml: parameter servers with roles from RANK, the chief's summary with
     every worker alive;
  4. mpijob.yaml: the launcher's mpirun under the mpi-operator's OMPI_MCA_* variables, its
     hostfile naming this host instead of the worker pods; the weights equal kolo run's.

Every run is shortened the same way for the pods and the reference (--epochs 1, a training
limit) and writes --save into a work directory. Exit 77 (ctest SKIP) where PyYAML or
Fashion-MNIST is missing.

With --pods-as-hosts, each PyTorchJob pod runs on a host of its own instead (a network
namespace with its own address, and a UTS namespace whose host name is the pod's name, as
Kubernetes names a pod's host), every pod resolving the others' names as the operator's
services do (/etc/hosts of the namespace); MASTER_ADDR is then exactly the operator's
service name, <job>-master-0, and the ranks talk over TCP as pods on a cluster do. Needs root
(exit 77 otherwise); parts 1-3 only.
Usage: kubernetes_test.py [--pods-as-hosts] KOLO_BINARY EXAMPLES_DIR [MPIRUN]
"""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("SKIPPED: Kubernetes test: PyYAML is missing (Debian: python3-yaml)")
    sys.exit(77)

ARGS = [a for a in sys.argv[1:] if a != "--pods-as-hosts"]
AS_HOSTS = len(ARGS) < len(sys.argv) - 1
KOLO, EXAMPLES = os.path.abspath(ARGS[0]), ARGS[1]
MPIRUN = ARGS[2] if len(ARGS) > 2 and not AS_HOSTS else ""
DATA = "/usr/share/datasets/fashion-mnist"
if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print("SKIPPED: Kubernetes test: Fashion-MNIST is not installed")
    sys.exit(77)

if AS_HOSTS and (os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None):
    print("SKIPPED: Kubernetes test with pods as hosts: needs root, ip (iproute2) and unshare")
    sys.exit(77)

WORK = tempfile.mkdtemp(prefix="kolo-k8s-test.")
# A pod sees its image's PATH (kolo on it) and HOME; nothing else comes from this process.
BASE_ENV = {"PATH": os.path.dirname(KOLO) + ":/usr/local/bin:/usr/bin:/bin", "HOME": WORK}
SHORT = {"--epochs": "1", "--train-limit": "2048"}
running = []


class PodHosts:
    """One network namespace per pod slot (rank), joined by a bridge, each resolving every pod
    name of the jobs to its slot's address. Removed by close(), whatever happened."""

    def __init__(self, slots, names_by_slot):
        tag = str(os.getpid())
        self.bridge = "kolo-k8s-br-" + tag
        self.hosts = ["kolo-k8s-%d-%s" % (i, tag) for i in range(slots)]
        subnet = "10.214.%d" % (os.getpid() % 250)
        self.addresses = ["%s.%d" % (subnet, i + 1) for i in range(slots)]
        self.created = []
        self.ip("netns", "add", self.bridge)
        self.created.append(self.bridge)
        self.ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.bridge, "link", "set", "br0", "up")
        lines = ["127.0.0.1 localhost"]
        for i, ns in enumerate(self.hosts):
            self.ip("netns", "add", ns)
            self.created.append(ns)
            self.ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p%d" % i,
                    "netns", self.bridge)
            self.ip("-n", self.bridge, "link", "set", "p%d" % i, "master", "br0")
            self.ip("-n", self.bridge, "link", "set", "p%d" % i, "up")
            self.ip("-n", ns, "addr", "add", self.addresses[i] + "/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            lines += ["%s %s" % (self.addresses[i], name) for name in names_by_slot[i]]
        for ns in self.hosts:
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % ns, "w") as f:
                f.write("\n".join(lines) + "\n")

    @staticmethod
    def ip(*args):
        subprocess.run(["ip"] + list(args), check=True, stdout=subprocess.DEVNULL)

    def wrap(self, slot, pod, command, env):
        """The command line that runs `command` on slot's host under host name `pod`, with
        exactly `env` (env -i: nothing of the wrappers' own environment reaches it)."""
        assignments = ["%s=%s" % kv for kv in env.items()]
        return (["ip", "netns", "exec", self.hosts[slot], "unshare", "--uts", "--", "sh", "-c",
                 'hostname "$0" && exec env -i "$@"', pod] + assignments + command)

    def close(self):
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)


HOSTS = None


def fail(message, *files):
    print("FAIL: " + message)
    for path in files:
        print("--- " + os.path.basename(path))
        with open(path, errors="replace") as f:
            print("".join(f.readlines()[-30:]), end="")
    sys.exit(1)


def load(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return yaml.safe_load(f)


def container(replica, name):
    """The container called `name` in a replica spec: its command + args and its env."""
    for c in replica["template"]["spec"]["containers"]:
        if c["name"] == name:
            env = {e["name"]: str(e.get("value", "")) for e in c.get("env", [])}
            return [str(w) for w in c.get("command", []) + c.get("args", [])], env, c
    fail("no container named %s in the replica spec" % name)


def with_flags(command, flags):
    """`command` with each flag's value replaced, or the flag appended where it is absent."""
    out = list(command)
    for flag, value in flags.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def start(command, env, log, host=None):
    """Starts `command` under exactly `env`; with host=(slot, pod) on that pod's own host."""
    out = open(log, "w")
    if host is not None:
        command = HOSTS.wrap(host[0], host[1], command, env)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # the wrappers' only; env -i drops it
    p = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True, cwd=WORK)
    running.append(p)
    return p


def wait_all(procs, what, logs, limit=120):
    """Waits for every process; a job that runs past `limit` s is a hang, killed and failed."""
    deadline = time.monotonic() + limit
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail("%s did not end within %d s" % (what, limit), *logs)
    return [p.returncode for p in procs]


def compare_weights(a, b):
    def read(path):
        data = open(path, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header, body = json.loads(data[8:8 + n]), data[8 + n:]
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            lo, hi = t["data_offsets"]
            out[name] = (t["shape"], struct.unpack("<%df" % ((hi - lo) // 4), body[lo:hi]))
        return out
    x, y = read(a), read(b)
    if x.keys() != y.keys() or any(x[k][0] != y[k][0] for k in x):
        return False, "different tensors"
    worst = max(abs(p - q) for k in x for p, q in zip(x[k][1], y[k][1]))
    count = sum(len(v[1]) for v in x.values())
    return worst <= 1e-5, "%d tensors, %d values, max |difference| %.3g" % (len(x), count, worst)


def reference(command, ranks, save):
    """kolo run -n RANKS of the pods' command, its weights in `save`."""
    log = os.path.join(WORK, os.path.basename(save) + ".log")
    p = start([KOLO, "run", "-n", str(ranks), "--bind", "none", "--"] +
              with_flags(command, dict(SHORT, **{"--save": save})),
              dict(BASE_ENV, OMP_NUM_THREADS="1"), log)
    if wait_all([p], "kolo run -n %d" % ranks, [log]) != [0]:
        fail("kolo run -n %d of the pods' command failed" % ranks, log)


class PyTorchJob:
    """The pods of a PyTorchJob manifest and the environment the training operator sets."""

    def __init__(self, name):
        self.file = name
        job = load(name)
        assert job["kind"] == "PyTorchJob", name
        self.name = job["metadata"]["name"]
        specs = job["spec"]["pytorchReplicaSpecs"]
        master_cmd, master_env, master = container(specs["Master"], "pytorch")
        ports = [p["containerPort"] for p in master.get("ports", []) if p["name"] == "pytorchjob-port"]
        if not ports:
            fail(name + ": the master's container has no port named pytorchjob-port")
        self.manifest_port = ports[0]
        # Rank order as the operator gives it: the master 0, worker i i + 1.
        self.pods = [("%s-master-0" % self.name, master_cmd, master_env)]
        if "Worker" in specs:
            cmd, env, _ = container(specs["Worker"], "pytorch")
            for i in range(specs["Worker"]["replicas"]):
                self.pods.append(("%s-worker-%d" % (self.name, i), cmd, env))
        self.command = master_cmd
        if any(cmd != master_cmd for _, cmd, _ in self.pods):
            fail(name + ": the master and the workers run different commands")

    def env(self, rank, port):
        """The operator's variables (envvar.go, master.go): MASTER_ADDR is the master's service,
        which resolves to the master pod; with every pod on this host, localhost. The port is
        a free one instead of the manifest's, since tests run side by side."""
        pod_env = dict(BASE_ENV)
        pod_env.update(self.pods[rank][2])
        master = self.pods[0][0] if AS_HOSTS else "localhost"
        pod_env.update({"PYTHONUNBUFFERED": "0", "MASTER_ADDR": master,
                        "MASTER_PORT": str(port), "WORLD_SIZE": str(len(self.pods)),
                        "RANK": str(rank)})
        return pod_env

    def run(self, tag, flags):
        # On hosts of their own the manifest's port; side by side with other tests, a free one.
        port = self.manifest_port if AS_HOSTS else free_port()
        procs, logs = [], []
        for rank, (pod, cmd, _) in enumerate(self.pods):
            logs.append(os.path.join(WORK, "%s.%s.log" % (tag, pod)))
            procs.append(start(with_flags(cmd, flags), self.env(rank, port), logs[-1],
                               (rank, pod) if AS_HOSTS else None))
        return procs, logs, port


def main():
    global HOSTS
    started = time.monotonic()
    job = PyTorchJob("pytorchjob.yaml")
    ps = PyTorchJob("pytorchjob_ps.yaml")
    if AS_HOSTS:
        slots = max(len(job.pods), len(ps.pods))
        names = [[j.pods[i][0] for j in (job, ps) if i < len(j.pods)] for i in range(slots)]
        HOSTS = PodHosts(slots, names)
        print("no Kubernetes cluster: each pod is a process on a host of its own (network and UTS "
              "namespaces, host name = pod name, addresses %s..%s), under the operator's "
              "environment" % (HOSTS.addresses[0], HOSTS.addresses[-1]))
    else:
        print("no Kubernetes cluster: each pod is a local process under the operator's environment")

    # 1. The data-parallel PyTorchJob against kolo run -n N.
    n = len(job.pods)
    ref = os.path.join(WORK, "run.safetensors")
    reference(job.command, n, ref)
    save = os.path.join(WORK, "pytorchjob.safetensors")
    procs, logs, port = job.run("dp", dict(SHORT, **{"--save": save}))
    codes = wait_all(procs, "the PyTorchJob's pods", logs)
    if codes != [0] * n:
        fail("the PyTorchJob's pods exited %s" % codes, *logs)
    same, result = compare_weights(save, ref)
    if not same:
        fail("the PyTorchJob's weights differ from kolo run -n %d's: %s" % (n, result))
    print("PyTorchJob %s (%s): %s, MASTER_ADDR=%s MASTER_PORT=%d WORLD_SIZE=%d RANK=0..%d"
          % (job.name, job.file, ", ".join(p for p, _, _ in job.pods), job.env(0, port)["MASTER_ADDR"],
             port, n, n - 1))
    print("  pods exited %s; weights equal kolo run -n %d's: %s" % (codes, n, result))

    # 2. Worker 1 (rank 2) killed once the job trains: the master has logged its progress,
    # which takes every rank's all-reduces. Each survivor ends with an error naming the rank it
    # lost; the first rank to notice names rank 2 (no other rank had failed), and the ranks
    # that notice later may name a neighbour that ended because of it.
    victim_rank = 2
    procs, logs, port = job.run("kill", {"--epochs": "50", "--save": save})
    deadline = time.monotonic() + 60
    while "epoch 1/50 " not in open(logs[0], errors="replace").read():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            fail("the master never logged a training step", *logs)
        time.sleep(0.1)
    procs[victim_rank].send_signal(signal.SIGKILL)
    codes = wait_all(procs, "the pods after rank %d was killed" % victim_rank, logs)
    others = [i for i in range(n) if i != victim_rank]
    if codes[victim_rank] != -signal.SIGKILL or any(codes[i] == 0 for i in others):
        fail("the pods exited %s after rank %d was killed" % (codes, victim_rank), *logs)
    errors = {}
    for i in others:
        lines = [l.strip() for l in open(logs[i], errors="replace") if "kolo: error:" in l]
        if not lines or "rank " not in lines[-1]:
            fail("pod %s ended with no error naming a rank" % job.pods[i][0], *logs)
        errors[i] = lines[-1]
    if not any("rank %d " % victim_rank in e for e in errors.values()):
        fail("no pod's error names rank %d" % victim_rank, *logs)
    print("PyTorchJob %s: pod %s (rank %d) killed with SIGKILL while training; the others exited %s:"
          % (job.name, job.pods[victim_rank][0], victim_rank, [codes[i] for i in others]))
    for i in others:
        print("  %s: %s" % (job.pods[i][0], errors[i][:160]))

    # 3. Parameter servers, roles from RANK.
    procs, logs, _ = ps.run("ps", dict(SHORT, **{"--ps-unit-batches": "4"}))
    codes = wait_all(procs, "the parameter-server PyTorchJob's pods", logs)
    if codes != [0] * len(ps.pods):
        fail("the parameter-server PyTorchJob's pods exited %s" % codes, *logs)
    servers = int(ps.pods[0][2].get("KOLO_PS_SERVERS", "0"))
    chief = open(logs[servers], errors="replace").read()
    summary = [l for l in chief.splitlines() if l.startswith("test_accuracy")]
    workers = len(ps.pods) - servers - 1
    if not summary or "workers_alive %d" % workers not in summary[-1]:
        fail("no summary of the chief (rank %d) with %d live workers" % (servers, workers), *logs)
    print("PyTorchJob %s (%s): KOLO_PS_SERVERS=%d, chief %s: %s"
          % (ps.name, ps.file, servers, ps.pods[servers][0], summary[-1][:120]))

    # 4. The MPIJob's launcher.
    if AS_HOSTS:
        print("MPIJob: run by the same-host test only (its launcher reaches the workers over SSH)")
    elif not MPIRUN:
        print("SKIPPED part: MPIJob (kolo was built without MPI, or mpirun is missing)")
    else:
        mpi = load("mpijob.yaml")
        assert mpi["kind"] == "MPIJob"
        specs = mpi["spec"]["mpiReplicaSpecs"]
        command, env, _ = container(specs["Launcher"], "mpi-launcher")
        slots = mpi["spec"].get("slotsPerWorker", 1)
        ranks = specs["Worker"]["replicas"] * slots
        if command[0] != "mpirun" or "-np" not in command or command[command.index("-np") + 1] != str(ranks):
            fail("mpijob.yaml: the launcher does not run mpirun -np %d (workers x slots)" % ranks)
        train = command[command.index("kolo"):]
        mpi_ref = os.path.join(WORK, "run_mpi.safetensors")
        reference(train, ranks, mpi_ref)
        # The hostfile the operator mounts names each worker pod with its slots; the pods are
        # this host here.
        hostfile = os.path.join(WORK, "hostfile")
        with open(hostfile, "w") as f:
            f.write("localhost slots=%d\n" % ranks)
        launcher_env = dict(BASE_ENV)
        launcher_env.update(env)
        launcher_env.update({"K_MPI_JOB_ROLE": "launcher",
                             "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                             "OMPI_MCA_orte_default_hostfile": hostfile,
                             "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                             "OMPI_MCA_orte_set_default_slots": str(slots),
                             "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""})
        save = os.path.join(WORK, "mpijob.safetensors")
        log = os.path.join(WORK, "mpijob.log")
        p = start([MPIRUN] + with_flags(command, dict(SHORT, **{"--save": save}))[1:],
                  launcher_env, log)
        if wait_all([p], "the MPIJob's launcher", [log]) != [0]:
            fail("the MPIJob's mpirun failed", log)
        same, result = compare_weights(save, mpi_ref)
        if not same:
            fail("the MPIJob's weights differ from kolo run -n %d's: %s" % (ranks, result))
        print("MPIJob %s (mpijob.yaml): %s on %d workers x %d slots"
              % (mpi["metadata"]["name"], " ".join(command[:command.index("kolo") + 2]) + " ...",
                 specs["Worker"]["replicas"], slots))
        print("  weights equal kolo run -n %d's: %s" % (ranks, result))

    print("Kubernetes test passed in %.1f s" % (time.monotonic() - started))


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in running:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if HOSTS:
            HOSTS.close()
        shutil.rmtree(WORK, ignore_errors=True)
