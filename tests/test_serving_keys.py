"""The server's key and the model key derived from it (`serving/keys.py`)."""

from __future__ import annotations

from lightning_sdk.serving.keys import MODEL_KEY_PREFIX, model_key, offered_keys, offers


def test_the_model_key_is_derived_stable_and_distinct_per_key() -> None:
    key = "sk-run-one"
    assert model_key(key) == model_key(key)  # runners compute the one the server accepts
    assert model_key(key).startswith(MODEL_KEY_PREFIX) and key not in model_key(key)
    assert model_key("sk-run-two") != model_key(key)
    assert not offers([model_key(key)], key)  # it does not open what the run's key opens


def test_offered_keys_read_both_clients_headers_and_odd_bytes_do_not_raise() -> None:
    assert offered_keys("Bearer  abc ", ["xyz"]) == ["abc", "xyz"]
    assert offered_keys("Basic abc", []) == []
    assert offers(["nope", "abc"], "abc")
    assert not offers(["cl\u00e9"], "abc")  # non-ASCII: compared as bytes, refused, no TypeError
    assert not offers(offered_keys("Bearer ", [""]), "")  # an empty key opens nothing, not even for ""
