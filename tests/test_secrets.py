"""No secret from a command line is kept (memscope/redact.py; docs/reference.md, "Secrets in the
command line"): the rule's cases one by one, then one real ``torchrun`` training under attach given
an API key, a token, a URL with a password and a ``--redact`` option's value, whose run file (and
its -wal mid-run), every reading command's output, every export and the dashboard are searched
byte by byte; the training itself saw its arguments unchanged. ``--no-redact`` keeps them, and
the environment is never stored."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, SCRIPTS, cli, memscope, torchrun
from memscope.redact import MASK, Redaction, is_secret_name, redact_argv, redact_urls

SECRETS = ("sk-SECRET123", "SECRET456", "u:pw", "SECRET789", "ENVSECRET000")
ARGS = ["--api-key=sk-SECRET123", "--token", "SECRET456", "https://u:pw@host/x",
        "--db-dsn", "SECRET789", "--max-tokens", "512"]
STORED = ["--api-key=***", "--token", "***", "https://***@host/x", "--db-dsn", "***",
          "--max-tokens", "512"]


# -- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, stored", [
    # the issue's: both forms, and a URL's user information anywhere
    (["--api-key=sk-SECRET123", "--token", "SECRET456"], ["--api-key=***", "--token", "***"]),
    (["https://u:pw@host/x"], ["https://***@host/x"]),
    (["--data=https://u:pw@host/x?a=b"], ["--data=https://***@host/x?a=b"]),
    (["git+ssh://git@github.com/x", "s3://AKIA:se@cret@bucket/k"], ["git+ssh://***@github.com/x", "s3://***@bucket/k"]),
    (["https://host/path@x", "http://host", "mailto:a@b"], ["https://host/path@x", "http://host", "mailto:a@b"]),
    # single dash, camelCase, snake case, run-together words, plurals that are secrets
    (["-token", "T", "-api_key=K", "--apiKey", "K", "--HF_TOKEN", "T", "--apikey=K", "--authtoken", "T"],
     ["-token", "***", "-api_key=***", "--apiKey", "***", "--HF_TOKEN", "***", "--apikey=***", "--authtoken", "***"]),
    (["--client-secret", "S", "--db-password=P", "--passwd", "P", "--aws-secret-access-key", "K",
      "--auth", "A", "--authorization", "Bearer", "--oauth=X", "--credentials", "C", "--cookie", "c",
      "--session-cookies=c", "--secrets", "s"],
     ["--client-secret", "***", "--db-password=***", "--passwd", "***", "--aws-secret-access-key", "***",
      "--auth", "***", "--authorization", "***", "--oauth=***", "--credentials", "***", "--cookie", "***",
      "--session-cookies=***", "--secrets", "***"]),
    # NAME=VALUE without dashes (Hydra overrides, an env assignment through `env`)
    (["env", "HF_TOKEN=hf_x", "+wandb.api_key=W", "lr=3e-4", "model.key_dim=64"],
     ["env", "HF_TOKEN=***", "+wandb.api_key=***", "lr=3e-4", "model.key_dim=64"]),
    # common training options that are not secrets: counts, tokenizers, dimensions, files
    (["--max-tokens", "512", "--max-new-tokens=64", "--tokenizer", "gpt2", "--num-keys", "3",
      "--key-dim", "64", "--token-file", "/p", "--auth-type", "basic", "--keys", "2", "--author", "me"],
     ["--max-tokens", "512", "--max-new-tokens=64", "--tokenizer", "gpt2", "--num-keys", "3",
      "--key-dim", "64", "--token-file", "/p", "--auth-type", "basic", "--keys", "2", "--author", "me"]),
    # the next argument is a value unless it is an option (a negative number is a value)
    (["--token", "--lr", "3", "--key", "-1", "--token"], ["--token", "--lr", "3", "--key", "***", "--token"]),
    (["--token=", "--token", ""], ["--token=", "--token", ""]),  # nothing to hide
    (["--password-stdin", "x"], ["--password-stdin", "x"]),  # a flag: its last word is stdin
    (["python", "-m", "train", "--", "--token", "T"], ["python", "-m", "train", "--", "--token", "***"]),
])
def test_the_rule(argv: list[str], stored: list[str]) -> None:
    assert redact_argv(argv) == stored
    assert redact_argv(stored) == stored  # stored twice (merge): the same
    assert redact_argv(argv, enabled=False) == argv


def test_patterns_extend_the_rule_and_are_checked() -> None:
    argv = ["--db-dsn", "D", "--dsn=D", "--hub-id", "H", "--api-keys", "a,b", "--dsnx", "v"]
    assert redact_argv(argv, ["dsn$", "^hub-", "KEYS$"]) == [
        "--db-dsn", MASK, "--dsn=***", "--hub-id", MASK, "--api-keys", MASK, "--dsnx", "v"]
    assert redact_argv(argv) == argv  # none of them by the built-in rule
    with pytest.raises(ValueError, match="not a regular expression"):
        Redaction(patterns=("(",))
    assert is_secret_name("OPENAI_API_KEY") and not is_secret_name("max_tokens")
    assert redact_urls("see postgres://a:b@db:5432/x and ftp://c@d") == "see postgres://***@db:5432/x and ftp://***@d"


def test_attach_refuses_a_pattern_that_is_not_a_regular_expression(tmp_path: Path) -> None:
    out = cli("attach", "--headless", "--db", str(tmp_path / "r.db"), "--redact", "(", "--", "true")
    assert out.returncode == 2 and "not a regular expression" in out.stderr
    assert out.stderr.count("\n") == 1 and not (tmp_path / "r.db").exists()


# -- a real run, every output -----------------------------------------------------------------

@pytest.fixture(scope="module")
def secret_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``torchrun`` with two ranks of tests/scripts/secret_argv.py under attach, given the
    secrets; an environment variable holds one more. The script copies the run file and its
    -wal at its third step (SECRET_ARGV_SNAP) and exits 3 if its argv is not as given."""
    d = tmp_path_factory.mktemp("secrets")
    snap = d / "midrun"
    snap.mkdir()
    db = d / "run.db"
    env = dict(os.environ, OMP_NUM_THREADS="1", SECRET_ARGV_EXPECT=json.dumps(ARGS),
               SECRET_ARGV_SNAP=str(snap), MEMSCOPE_TEST_TOKEN="ENVSECRET000")
    out = subprocess.run([sys.executable, "-m", "memscope", "attach", "--headless", "--db", str(db),
                          "--redact", "dsn", "--", *torchrun(2), str(SCRIPTS / "secret_argv.py"), *ARGS],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]  # 3: the script saw its argv changed
    return {"db": db, "dir": d, "snap": snap, "attach": out.stdout + out.stderr}


def _outputs(run: dict[str, Any]) -> dict[str, bytes]:
    """Every byte memscope wrote or printed about the run: the file, its mid-run copies, each
    reading command's output, each export."""
    db, d = run["db"], run["dir"]
    found: dict[str, bytes] = {"attach": run["attach"].encode()}
    for p in [db, *sorted(run["snap"].iterdir())]:
        found[p.name] = p.read_bytes()
    assert {"rank0.db", "rank0-wal", "rank1.db", "rank1-wal"} <= set(found)  # mid-run, both ranks
    commands = [["report", str(db)], ["report", str(db), "--json"], ["report", str(db), "--html", str(d / "r.html")],
                ["leaks", str(db)], ["leaks", str(db), "--json"], ["oom", str(db)], ["oom", str(db), "--json"],
                ["layers", str(db)], ["layers", str(db), "--json"], ["diff", str(db), str(db)],
                ["export", str(db), "--chrome", str(d / "t.json"), "--csv", str(d / "csv")],
                ["export", str(db), "--csv", str(d / "timeline.csv")]]
    for argv in commands:
        out = cli(*argv)
        assert out.returncode == 0, (argv, out.stderr)
        found[" ".join(argv[:1] + argv[2:3])] = (out.stdout + out.stderr).encode()
    for p in [d / "r.html", d / "t.json", d / "timeline.csv", *sorted((d / "csv").iterdir())]:
        found[p.name] = p.read_bytes()
    return found


def test_no_secret_in_the_file_or_any_output(secret_run: dict[str, Any]) -> None:
    found = _outputs(secret_run)
    leaks = [(name, s) for name, data in found.items() for s in SECRETS if s.encode() in data]
    assert not leaks, leaks
    # what is stored: the rule's form, the same for the run and every rank
    conn = sqlite3.connect(secret_run["db"])
    command = json.loads(conn.execute("SELECT command FROM run").fetchone()[0])
    argvs = [json.loads(a) for (a,) in conn.execute("SELECT argv FROM processes ORDER BY rank")]
    ranks = [r for (r,) in conn.execute("SELECT rank FROM processes ORDER BY rank")]
    conn.close()
    assert command[-len(STORED):] == STORED and "torchrun" in command[0]
    assert ranks == [0, 1] and all(a[1:] == STORED for a in argvs), argvs
    # and every output that shows the command shows that stored form (leaks, oom and layers
    # show none of it)
    assert shlex.join(STORED) in found["report"].decode()
    assert " ".join(STORED) in found["r.html"].decode()
    assert json.loads(found["report --json"])["run"]["command"] == command
    assert json.loads(found["t.json"])["otherData"]["command"] == command
    assert "--api-key=***" in found["run.csv"].decode()


async def test_the_dashboard_header_shows_the_stored_form(secret_run: dict[str, Any]) -> None:
    from textual.widgets import Static

    from memscope_tui.app import MemscopeApp

    app = MemscopeApp(str(secret_run["db"]))
    async with app.run_test(size=(200, 30)) as pilot:
        while app.loads < 1:
            await pilot.pause(0.05)
        await pilot.pause()
        header = " ".join(str(w.render()) for w in app.query(Static))
    assert "--api-key=***" in header and "https://***@host/x" in header
    assert not [s for s in SECRETS if s in header]


def test_no_redact_keeps_them_and_a_command_no_agent_ran_in_is_redacted(tmp_path: Path) -> None:
    """``--no-redact`` reaches the agent (a training process) and the run row; a command that
    never imports torch gets its ``agent_missing`` event, whose command is redacted too."""
    db = tmp_path / "kept.db"
    env = dict(os.environ, SECRET_ARGV_EXPECT=json.dumps(ARGS))
    out = memscope("attach", "--headless", "--no-redact", "--db", str(db), str(SCRIPTS / "secret_argv.py"),
                   *ARGS, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    conn = sqlite3.connect(db)
    command = json.loads(conn.execute("SELECT command FROM run").fetchone()[0])
    assert command[1:] == [str(SCRIPTS / "secret_argv.py"), *ARGS]
    assert json.loads(conn.execute("SELECT argv FROM processes").fetchone()[0])[1:] == ARGS
    conn.close()
    empty = tmp_path / "empty.db"
    out = memscope("attach", "--headless", "--db", str(empty), "--", "true", *ARGS[:4])
    assert out.returncode == 0, out.stderr
    data = empty.read_bytes()
    assert not [s for s in SECRETS if s.encode() in data]
    conn = sqlite3.connect(empty)
    (event,) = conn.execute("SELECT data FROM events WHERE kind = 'agent_missing'").fetchone()
    conn.close()
    assert json.loads(event)["command"] == ["true", *STORED[:4]]


@pytest.mark.parametrize("kept", [False, True])
def test_merge_applies_each_inputs_rule_again(secret_run: dict[str, Any], tmp_path: Path, kept: bool) -> None:
    """An input written before memscope redacted (its secrets planted back in a copy) merges into
    a file without them; an input recorded with --no-redact is copied as it is."""
    from memscope.store.merge import merge_runs

    old = tmp_path / "old.db"
    old.write_bytes(secret_run["db"].read_bytes())
    raw = json.dumps(["python", "train.py", *ARGS])
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE run SET command = ?", (raw,))
        conn.execute("UPDATE processes SET argv = ?", (raw,))
        if kept:
            conn.execute("UPDATE processes SET options = json_set(options, '$.redact', json('false'))")
    merge_runs(str(tmp_path / "merged.db"), [str(old)])
    conn = sqlite3.connect(tmp_path / "merged.db")
    stored = [json.loads(a) for (a,) in conn.execute("SELECT command FROM run UNION ALL SELECT argv FROM processes")]
    conn.close()
    assert len(stored) == 3
    assert all(s == json.loads(raw) if kept else s == ["python", "train.py", *STORED] for s in stored), stored
