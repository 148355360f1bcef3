"""best.env reads the same under docker --env-file, systemd EnvironmentFile= and bash `set -a; .`.

The docker and systemd parsers below are written from their documented rules (docker run
--env-file reference; systemd.exec(5) EnvironmentFile=), not from tuner.output.envfile, so they check the
writer independently.  bash is the real thing, run with an empty environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fakestudy import make_study_dir, run_cli
from tuner.output import envfile
from tuner.errors import UsageError

BASH_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}


def docker_env_file(text: str) -> dict[str, str]:
    """docker: leading whitespace trimmed, '#' lines and blank lines skipped, VAR=VAL split at the
    first '=', the value kept verbatim (quotes and trailing spaces included), VAR alone = host env."""
    out = {}
    for line in text.split("\n"):
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert not any(c.isspace() for c in key), f"docker rejects key {key!r}"
        if sep:
            out[key] = value
    return out


def systemd_env_file(text: str) -> dict[str, str]:
    """systemd: '#'/';' lines are comments (a trailing backslash continues the comment); KEY=VALUE
    with whitespace around key and unquoted value trimmed; '...' literal; "..." with \\ escaping
    only " \\ ` $ (and eating escaped newlines); unquoted backslash escapes the next char and a
    backslash-newline joins lines."""
    out: dict[str, str] = {}
    state, key, value = "pre_key", "", ""
    trailing = ""  # unquoted whitespace held back until more value follows

    def push() -> None:
        out[key.strip()] = value

    for c in text + "\n":
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in " \t\n\r":
                state, key = "key", c
        elif state == "key":
            if c in "\n\r":
                state, key = "pre_key", ""
            elif c == "=":
                state, value, trailing = "pre_value", "", ""
            else:
                key += c
        elif state in ("pre_value", "value"):
            if c in "\n\r":
                push()
                state, key = "pre_key", ""
            elif state == "pre_value" and c == "'":
                state = "single"
            elif state == "pre_value" and c == '"':
                state = "double"
            elif c == "\\":
                value += trailing
                state, trailing = "escape", ""
            elif c in " \t":
                if state == "value":
                    trailing += c
            else:
                value += trailing + c
                state, trailing = "value", ""
        elif state == "escape":
            state = "value"
            if c != "\n":
                value += c
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value += c
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value += c
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                value += c
            elif c != "\n":
                value += "\\" + c
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in "\n\r":
                state = "pre_key"
        elif state == "comment_escape":
            state = "comment"
    return out


def bash_env_file(path: Path) -> dict[str, str]:
    """bash: `env -i bash -c 'set -a; . ./best.env; env -0'` in the file's folder."""
    proc = subprocess.run(["env", "-i", "bash", "-c", "set -a; . ./" + path.name + "; env -0"],
                          cwd=path.parent, capture_output=True, text=True, check=True)
    assert proc.stderr == ""
    pairs = (item.partition("=") for item in proc.stdout.split("\0") if item)
    return {k: v for k, _, v in pairs if k not in BASH_OWN}


def three_ways(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    text = path.read_text()
    return docker_env_file(text), systemd_env_file(text), bash_env_file(path)


def test_parsers_disagree_on_quotes_which_is_why_the_rule_exists():
    text = 'A="x y"\n'
    assert docker_env_file(text) == {"A": '"x y"'}
    assert systemd_env_file(text) == {"A": "x y"}


SAFE = {"PLAIN": "abc", "NUM": "0.95", "EMPTY": "", "PATHLIKE": "/models/Llama-3.1-8B_v2",
        "URL": "http://127.0.0.1:8000/v1", "LIST": "1,2,4,8", "EQ": "a=b==c", "SYMBOLS": "+x@y%z-",
        "DASH": "-leading", "TUNER_SERVER_ARGS": envfile.encode_server_args(["--num-blocks", "64", "--enable-graph"])}


def test_safe_values_read_identically_three_ways(tmp_path):
    hostile_header = ["model: $(touch pwned) `touch pwned2` \\", "gpu: line\nbreak; rm -rf /tmp/nothing"]
    path = tmp_path / "best.env"
    envfile.write_atomic(path, envfile.render(SAFE, hostile_header))
    docker, systemd, bash = three_ways(path)
    assert docker == systemd == bash == SAFE
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert all(line.startswith("#") or "=" in line for line in path.read_text().splitlines())
    assert envfile.decode_server_args(bash["TUNER_SERVER_ARGS"]) == ["--num-blocks", "64", "--enable-graph"]
    assert envfile.parse(path.read_text()) == SAFE


def test_exported_best_env_reads_identically_three_ways(tmp_path):
    make_study_dir(tmp_path / "studies")
    assert run_cli(["export", "--studies-dir", str(tmp_path / "studies")]) == 0
    path = tmp_path / "studies" / "demo" / "best.env"
    docker, systemd, bash = three_ways(path)
    assert docker == systemd == bash
    assert set(bash) == {"INFINILM_PREFILL_BATCH_CAP", "INFINILM_DECODE_FIRST_WHEN_RUNNING", "TUNER_SERVER_ARGS"}
    assert bash["TUNER_SERVER_ARGS"].startswith("--num-blocks,")
    # the documented way to expand the args variable gives back the argv tokens
    split = subprocess.run(["env", "-i", "bash", "-c", 'set -a; . ./best.env; IFS=, read -ra A <<<"$TUNER_SERVER_ARGS";'
                            ' printf "%s\\n" "${A[@]}"'], cwd=path.parent, capture_output=True, text=True, check=True)
    assert split.stdout.split() == envfile.decode_server_args(bash["TUNER_SERVER_ARGS"])


HOSTILE = {"space": "a b", "dquote": 'a"b', "squote": "it's", "subst": "$(touch pwned)", "var": "$HOME",
           "backtick": "`touch pwned`", "newline": "a\nb", "cr": "a\rb", "backslash": "a\\b",
           "tilde": "~/x", "semicolon": "a;b", "hash": "a#b", "tab": "a\tb", "glob": "*", "unicode": "é"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_values_are_refused_naming_the_key(name):
    with pytest.raises(UsageError, match="HOSTILE_KEY"):
        envfile.render({"OK": "1", "HOSTILE_KEY": HOSTILE[name]})


@pytest.mark.parametrize("token", ["a b", "x,y", "", "$(id)", "a\nb"])
def test_hostile_server_args_are_refused(token):
    with pytest.raises(UsageError, match="TUNER_SERVER_ARGS"):
        envfile.encode_server_args(["--flag", token])


@pytest.mark.parametrize("key", ["A-B", "1X", "A B", "PPID", "IFS", "SHELLOPTS", ""])
def test_bad_or_bash_special_keys_are_refused(key):
    with pytest.raises(UsageError):
        envfile.render({key: "1"})


def test_comment_lines_stay_single_inert_lines():
    line = envfile.comment("x\\\n$(y)é")
    assert "\n" not in line and "\\" not in line and line.startswith("# ")


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "best.env"
    with pytest.raises(UnicodeEncodeError):
        envfile.write_atomic(path, "A=é\n")
    assert list(tmp_path.iterdir()) == []


def test_parse_refuses_what_render_would_not_write():
    with pytest.raises(UsageError, match="FOO"):
        envfile.parse('# fine\nFOO="a b"\n')
    with pytest.raises(UsageError, match="line 2"):
        envfile.parse("A=1\nexport B\n")
