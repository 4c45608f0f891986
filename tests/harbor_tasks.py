"""Harbor task folders written for tests: one per way a test.sh can score (reward.txt, reward.json, a failing
`set -e` test.sh, a test.sh that hangs past its limit), all FROM the hrl base image so they build offline."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = """\
FROM hrl/base:bookworm
WORKDIR /app
RUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py
"""
FIX = "sed -i 's/a - b/a + b/' /app/calc.py\n"
CHECK = "python3 -c 'import sys; sys.path.insert(0, \"/app\"); import calc; assert calc.add(2, 3) == 5'"

TASKS: dict[str, dict[str, str]] = {
    "reward-file": {  # reward.txt from the test's outcome
        "test.sh": f"if {CHECK}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n",
        "solve.sh": FIX,
        "toml": "[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n",
    },
    "reward-json": {  # reward.json; the answer lives outside the workdir (the whole container carries over)
        "test.sh": 'if [ "$(cat /opt/answer.txt 2>/dev/null)" = 42 ]; then r=1; else r=0; fi\n'
        'echo "{\\"reward\\": $r, \\"style\\": 0.5}" > /logs/verifier/reward.json\n',
        "solve.sh": "mkdir -p /opt && echo 42 > /opt/answer.txt\n",
        "toml": '[verifier]\ntimeout_sec = 60.0\n\n[environment]\ncpus = 1\nmemory = "1G"\n',
    },
    "failing-test": {  # set -e: a failing check exits before any reward is written
        "test.sh": f"set -e\n{CHECK}\necho 1 > /logs/verifier/reward.txt\n",
        "solve.sh": FIX,
        "toml": "[verifier]\ntimeout_sec = 60.0\n",
    },
    "slow-test": {  # hangs unless the agent left /app/fast: past [verifier] timeout_sec, reward 0
        "test.sh": "if [ -f /app/fast ]; then echo 1 > /logs/verifier/reward.txt; else sleep 120; fi\n",
        "solve.sh": "touch /app/fast\n",
        "toml": "[verifier]\ntimeout_sec = 3.0\n",
    },
}


# A task whose environment serves a web app ([browser]): the order is confirmed by the page's button, which the app
# records in /app/state; test.sh reads that state in the grading container (the app no longer runs there).
WEB_APP = """\
import http.server, os

PAGE = b'''<!doctype html><title>Shop</title><h1>Your order</h1><p>One kettle, 30 EUR.</p>
<form method="post" action="/confirm"><button type="submit">Confirm order</button></form>'''


class App(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.reply(PAGE)

    def do_POST(self):
        if self.path == "/confirm":
            os.makedirs("/app/state", exist_ok=True)
            open("/app/state/confirmed", "w").write("kettle\\n")
        self.reply(b"<!doctype html><title>Shop</title><p>Order confirmed.</p>")

    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


http.server.ThreadingHTTPServer(("127.0.0.1", 8080), App).serve_forever()
"""
WEB_DOCKERFILE = """\
FROM hrl/base:bookworm
WORKDIR /app
COPY app.py /srv/app.py
"""
WEB_TASK = {
    "test.sh": 'if [ "$(cat /app/state/confirmed 2>/dev/null)" = kettle ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n",
    "solve.sh": "mkdir -p /app/state && echo kettle > /app/state/confirmed\n",
    "toml": "[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 300.0\n\n"
    '[browser]\nstart = "python3 /srv/app.py"\nport = 8080\npath = "/"\nready_timeout_sec = 30.0\n',
}


def write_web_task(root: Path, name: str = "web-order") -> Path:
    """The web app task: confirm the order in the browser."""
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(f'version = "1.0"\n\n[task]\nname = "hrl-tests/{name}"\n\n{WEB_TASK["toml"]}')
    (folder / "instruction.md").write_text("The shop's page is open in your browser. Confirm the order.\n")
    (folder / "environment" / "Dockerfile").write_text(WEB_DOCKERFILE)
    (folder / "environment" / "app.py").write_text(WEB_APP)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + WEB_TASK["test.sh"])
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + WEB_TASK["solve.sh"])
    return folder


def write_task(root: Path, name: str) -> Path:
    spec, folder = TASKS[name], root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(f'version = "1.0"\n\n[task]\nname = "hrl-tests/{name}"\n\n{spec["toml"]}')
    (folder / "instruction.md").write_text(f"Task {name}: make the tests in this environment pass.\n")
    (folder / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + spec["test.sh"])
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + spec["solve.sh"])
    return folder


def write_dataset(root: Path, names: tuple[str, ...] = tuple(TASKS)) -> Path:
    """A folder of Harbor task folders (a dataset); returns it."""
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_task(root, name)
    return root
