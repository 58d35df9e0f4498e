"""The connection file (owner-only, replaced whole) and the signed messages (HMAC, no replays)."""

from __future__ import annotations

import json
import os
import stat

from mtlab.remote.wire import (CONNECTION_FILE, Verifier, connection, encode, new_key, process_gone, read_connection,
                               write_private)


def test_a_signed_message_is_read_once_and_a_changed_or_foreign_one_never() -> None:
    key = new_key()
    signature, body = encode(key, {"command": "set", "args": {"name": "lr", "value": 0.1}})
    v = Verifier(key)
    assert v.decode(signature, body) == {"command": "set", "args": {"name": "lr", "value": 0.1}}
    assert v.decode(signature, body) is None  # the same message again: a replay
    signature, body = encode(key, {"command": "stop"})
    assert v.decode(signature, body.replace(b"stop", b"stap")) is None  # changed on the way
    other, body2 = encode(new_key(), {"command": "stop"})
    assert Verifier(key).decode(other, body2) is None  # another job's key


def test_the_connection_file_is_its_owners_alone_from_the_start_and_when_replaced(tmp_path) -> None:
    path = tmp_path / CONNECTION_FILE
    path.write_text("{}")
    os.chmod(path, 0o644)  # an older file readable by others: the new one is not
    info = connection("127.0.0.1", 5555, new_key(), tmp_path, 1)
    write_private(path, info)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["key"] == info["key"]
    assert not [p for p in tmp_path.iterdir() if p.name != CONNECTION_FILE]  # no temporary file left
    assert read_connection(tmp_path) == (info, path) == read_connection(path)
    assert read_connection(tmp_path / "nothing")[0] is None
    assert info["ip"] == "127.0.0.1" and info["pid"] == os.getpid() and not process_gone(info)
    assert process_gone({**info, "pid": 2**22 + 12345})
