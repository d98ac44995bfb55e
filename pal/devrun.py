"""`make run`: the embedded default in one terminal."""

# Makes the receipt signing key var/receipt-key.pem once, migrates the SQLite database under var/, loads
# workflows/, creates the user admin (printing its generated password once), then runs the web app, one Celery
# worker and Celery beat. A worker that dies (say, the kill -9 of the README's tour) is started again; its pid is
# in worker.pid under PAL_VAR_DIR (var/), for `make tour`. Ctrl-C stops everything.

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def manage(*args):
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, check=True)


def ensure_admin():
    code = (
        "from django.contrib.auth import get_user_model\n"
        "import sys\n"
        "User = get_user_model()\n"
        "if User.objects.filter(username='admin').exists():\n"
        "    sys.exit(3)\n"
        "User.objects.create_superuser('admin', 'admin@localhost', sys.argv[1])\n"
    )
    password = secrets.token_urlsafe(12)
    result = subprocess.run(
        [PY, "-c", "import django; django.setup(); exec(open(0).read())", password], input=code, text=True, cwd=ROOT
    )
    if result.returncode == 0:
        print(
            f"\n  created user admin with password: {password}\n  (printed once; change it in the admin, or set a new "
            f"one with `.venv/bin/python manage.py changepassword admin`)\n",
            flush=True,
        )
    elif result.returncode == 3:
        print(
            "  user admin exists already (its password was printed on the first `make run`; "
            "`.venv/bin/python manage.py changepassword admin` sets a new one)",
            flush=True,
        )
    else:
        sys.exit("could not create the admin user")


def ensure_receipt_key():
    """Receipts are signed under `make run` too: a key pair made once under var/ (mode 0600), used by every
    process started here unless PAL_RECEIPT_PRIVATE_KEY(_FILE) is set already."""
    if os.environ.get("PAL_RECEIPT_PRIVATE_KEY") or os.environ.get("PAL_RECEIPT_PRIVATE_KEY_FILE"):
        return
    path = ROOT / "var" / "receipt-key.pem"
    if not path.exists():
        # Only the first `make run` makes a key: later ones skip the import.
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        print(
            f"  made the receipt signing key {path.relative_to(ROOT)} (public key: /api/v1/receipts/public-key)",
            flush=True,
        )
    os.environ["PAL_RECEIPT_PRIVATE_KEY_FILE"] = str(path)


PROCESSES = {
    "web": [
        PY,
        "-m",
        "uvicorn",
        "pal.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        os.environ.get("PORT", "8000"),
    ],
    "worker": [
        PY,
        "-m",
        "celery",
        "-A",
        "pal",
        "worker",
        "--concurrency",
        "2",
        "--loglevel",
        "INFO",
        "-n",
        "worker@%h",
    ],
    "beat": [PY, "-m", "celery", "-A", "pal", "beat", "--loglevel", "INFO"],
}


def var_dir() -> Path:
    """Where the settings keep the SQLite database and the broker's files: PAL_VAR_DIR, else var/."""
    return Path(os.environ.get("PAL_VAR_DIR") or ROOT / "var")


def ensure_metrics_dir():
    """GET /metrics sums the step, token and cost counters of the worker and the web app through files in one
    directory (pal.meters); emptied at each start, as prometheus_client's multiprocess mode asks."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    path = ROOT / "var" / "prometheus"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


def main():
    os.chdir(ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pal.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    # The checkout first, then a PYTHONPATH of the user's (where their own workflow modules may live).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("PAL_WORKFLOW_MODULES", "workflows.refund")  # the tour's Python workflow
    ensure_receipt_key()
    ensure_metrics_dir()
    manage("migrate", "--verbosity", "0")
    manage("pal_load_workflows")
    ensure_admin()
    children: dict[str, subprocess.Popen] = {}

    def start(name):
        children[name] = subprocess.Popen(PROCESSES[name], cwd=ROOT, start_new_session=True)
        if name == "worker":  # the leader of its process group: `kill -9 -- -PID` kills its pool too (make tour)
            var_dir().mkdir(parents=True, exist_ok=True)
            (var_dir() / "worker.pid").write_text(f"{children[name].pid}\n")
        print(f"  started {name} (pid {children[name].pid})", flush=True)

    def stop_all(*_):
        for proc in children.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    for name in PROCESSES:
        start(name)
    print(
        "\n  PAL Ops is on http://127.0.0.1:{port}/  (admin: /admin/, runs: /runs/)  Ctrl-C stops everything.\n".format(
            port=os.environ.get("PORT", "8000")
        ),
        flush=True,
    )
    while True:
        time.sleep(1)
        for name, proc in list(children.items()):
            code = proc.poll()
            if code is None:
                continue
            if name == "worker":
                # Kill the worker's pool too, so nothing of the dead worker keeps a lease alive.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                print(f"  worker exited ({code}); starting it again: the sweep re-drives its runs", flush=True)
                start(name)
            else:
                print(f"  {name} exited ({code}); stopping", flush=True)
                stop_all()


if __name__ == "__main__":
    main()
