"""The vault catalogue on every store (in memory, SQLite, PostgreSQL): names and locations,
never values; and :class:`Vaults` over it with the owner-only file."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from chatflow_cli.core.errors import UsageError, VaultFileError, VaultNotFoundError
from chatflow_cli.core.memory import BaseSessionStore
from chatflow_cli.core.resources.secrets import scrub_values, values_read
from chatflow_cli.core.resources.vaults import MissingSecret, SessionSecrets, Vaults


def test_the_catalogue_keeps_names_and_locations(any_store: BaseSessionStore,
                                                 make_store: Callable[..., BaseSessionStore]) -> None:
    created = any_store.create_vault("work")
    assert (created.name, created.entries) == ("work", ())
    with pytest.raises(UsageError, match="exists already"):
        any_store.create_vault("work")
    for bad in ("", "../x", "a b", "x" * 65, "-x", "a\x00"):
        with pytest.raises(UsageError, match="is not valid"):
            any_store.create_vault(bad)
    any_store.create_vault("alpha")
    any_store.set_vault_entry("work", "tok", "keyring")
    any_store.set_vault_entry("work", "api", "env:API_KEY")
    replaced = any_store.set_vault_entry("work", "tok", "file")
    with pytest.raises(VaultNotFoundError):
        any_store.set_vault_entry("nope", "tok", "file")
    with pytest.raises(UsageError, match="keyring, file or env:VAR"):
        any_store.set_vault_entry("work", "tok", "somewhere")
    again = make_store()  # opened again: what another process sees
    listed = again.list_vaults()
    assert [v.name for v in listed] == ["alpha", "work"]
    work = again.get_vault("work")
    assert work is not None
    assert [(e.name, e.location) for e in work.entries] == [("api", "env:API_KEY"), ("tok", "file")]
    assert work.entry("tok").updated_at == pytest.approx(replaced.updated_at)
    assert again.get_vault("nope") is None
    assert again.delete_vault_entry("work", "api") and not again.delete_vault_entry("work", "api")
    assert again.delete_vault("work") and not again.delete_vault("work")
    assert [v.name for v in again.list_vaults()] == ["alpha"]
    assert again.get_vault("work") is None


def test_vaults_over_a_store_with_the_owner_only_file(any_store: BaseSessionStore, tmp_path: Path) -> None:
    vaults = Vaults(any_store, tmp_path / "data", use_keyring=False)
    vaults.create("work")
    vaults.create("home")
    value = "file-secret-0123456789"
    assert vaults.set("work", "tok", value).location == "file"
    path = tmp_path / "data" / "vault-secrets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert value in values_read() and scrub_values(f"x {value} y") == "x [redacted] y"
    assert vaults.read("work", "tok") == value
    os.environ["CHATFLOW_TEST_VAULT_VALUE"] = "env-secret-0123456789"
    try:
        vaults.set("home", "tok", env="CHATFLOW_TEST_VAULT_VALUE")
        # mount order decides: the first vault holding the entry wins
        assert SessionSecrets(vaults, ["home", "work"]).get("tok") == "env-secret-0123456789"
        assert SessionSecrets(vaults, ["work", "home"]).get("tok") == value
        with pytest.raises(MissingSecret, match=r"'other', which no mounted vault holds \(searched: 'work', "
                                                r"'gone'\) \(no vault 'gone' exists\)"):
            SessionSecrets(vaults, ["work", "gone"]).get("other")
        # moving the entry to the variable removes the value from the file
        vaults.set("work", "tok", env="CHATFLOW_TEST_VAULT_VALUE")
        assert value not in path.read_text()
    finally:
        del os.environ["CHATFLOW_TEST_VAULT_VALUE"]
    assert vaults.read("work", "tok") is None  # the variable is unset now
    vaults.set("work", "tok", value, location="file")
    path.chmod(0o640)
    with pytest.raises(VaultFileError, match=r"open to other users \(mode 0640\)"):
        vaults.read("work", "tok")
    path.chmod(0o600)
    with pytest.raises(UsageError, match="at least 8 characters"):
        vaults.set("work", "tok", "short")
    vaults.remove("work")
    assert any_store.get_vault("work") is None and "work" not in path.read_text()
    with pytest.raises(VaultNotFoundError):
        vaults.remove("work")


def test_names_follow_the_one_rule_and_a_credential_is_no_name(any_store: BaseSessionStore) -> None:
    token = "ghp_" + "a1B2c3D4" * 4 + "e5F6"  # the shape of a GitHub token
    for bad, why in (("Work2", "it holds an uppercase letter"), (token.lower(), "it looks like a credential"),
                     ("w=" + token, "it holds '='")):
        with pytest.raises(UsageError, match=why) as caught:
            any_store.create_vault(bad)
        assert token[4:].lower() not in caught.value.message.lower()
        with pytest.raises(UsageError, match=why):
            any_store.create_memory_store(bad)
    any_store.create_vault("work")
    with pytest.raises(UsageError, match="entry name is not valid: it looks like a credential") as caught:
        any_store.set_vault_entry("work", token, "file")
    assert token not in caught.value.message
    assert any_store.set_vault_entry("work", "GITHUB_TOKEN", "env:GITHUB_TOKEN").name == "GITHUB_TOKEN"
    assert [e.name for e in any_store.get_vault("work").entries] == ["GITHUB_TOKEN"]
