"""The mount model: the command-line forms, the naming rule, the fold of mount events."""

from __future__ import annotations

import pytest

from chatflow_cli.core.errors import ExitStatus, UsageError
from chatflow_cli.core.events import RESERVED_EVENT_TYPES, EventType
from chatflow_cli.core.resources import Mount, check_resource_name, fold_mounts, parse_mount


@pytest.mark.parametrize(("text", "mode"), [
    ("notes", "read-write"), ("notes:ro", "read-only"), ("notes:rw", "read-write"),
    ("notes:read-only", "read-only"), ("notes:read-write", "read-write"), ("notes:RO", "read-only"),
])
def test_memory_store_forms(text: str, mode: str) -> None:
    assert parse_mount(text) == Mount("memory_store", "notes", mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["notes:rx", "notes:", "notes:write", "notes:ro:rw"])
def test_a_mode_that_does_not_exist_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="does not exist") as caught:
        parse_mount(text)
    assert caught.value.exit_code is ExitStatus.USAGE


@pytest.mark.parametrize("name", ["", "Notes", "-x", "a/b", "a b", "x" * 65, "../x", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="name"):
        check_resource_name(name)
    with pytest.raises(UsageError):
        parse_mount(f"{name}:ro")


def test_good_names() -> None:
    for name in ("notes", "team.crm", "acme-2024", "a", "0_x", "x" * 64):
        assert check_resource_name(name) == name


def test_a_vault_is_read_only() -> None:
    assert parse_mount("keys", "vault") == Mount.vault("keys")
    assert parse_mount("keys:ro", "vault").mode == "read-only"
    with pytest.raises(UsageError, match="read-only"):
        parse_mount("keys:rw", "vault")
    with pytest.raises(UsageError, match="read-only"):
        Mount("vault", "keys", "read-write")


def test_the_fold_of_mount_events() -> None:
    notes, crm, keys = Mount.memory_store("notes"), Mount.memory_store("crm", "read-only"), Mount.vault("keys")
    events = [("resource.mounted", notes.to_dict()), ("resource.mounted", crm.to_dict()),
              ("message.user", {}), ("resource.mounted", keys.to_dict()),
              ("resource.unmounted", crm.to_dict()),
              ("resource.mounted", Mount.memory_store("notes", "read-only").to_dict())]
    assert fold_mounts(events) == [Mount.memory_store("notes", "read-only"), keys]
    assert Mount.from_dict(notes.to_dict()) == notes
    assert str(crm) == "crm:ro"


def test_mount_events_are_reserved() -> None:
    assert EventType.RESOURCE_MOUNTED.value == "resource.mounted"
    assert {"resource.mounted", "resource.unmounted"} <= RESERVED_EVENT_TYPES


def test_one_resource_in_two_modes_is_refused() -> None:
    from chatflow_cli.core.resources.mounts import unique_mounts

    notes, notes_ro, keys = Mount.memory_store("notes"), Mount.memory_store("notes", "read-only"), Mount.vault("keys")
    assert unique_mounts([notes, keys, notes, Mount.memory_store("crm")]) == [notes, keys, Mount.memory_store("crm")]
    with pytest.raises(UsageError, match="memory store 'notes' is mounted twice in --memory, as notes:rw and as "
                                         "notes:ro") as caught:
        unique_mounts([notes, keys, notes_ro], "--memory")
    assert caught.value.exit_code is ExitStatus.USAGE
    # a vault and a memory store of one name are two resources
    assert unique_mounts([Mount.vault("notes"), notes_ro]) == [Mount.vault("notes"), notes_ro]


def test_a_name_mixing_cases_is_never_shown_and_secret_takes_one_case() -> None:
    from chatflow_cli.core.resources.secrets import NOT_SHOWN, quoted_name
    from chatflow_cli.core.tools import Secret, ToolDefinitionError

    assert quoted_name("work") == "'work'" and quoted_name("GITHUB_TOKEN", entry=True) == "'GITHUB_TOKEN'"
    for name in ("Zq9SECRETvalue-7781xx", "Work2", "GITHUB_TOKEN"):
        assert quoted_name(name) == NOT_SHOWN, name
    assert quoted_name("Zq9SECRETvalue-7781xx", entry=True) == NOT_SHOWN
    with pytest.raises(UsageError) as caught:
        check_resource_name("Zq9SECRETvalue-7781xx", "vault")
    assert "zq9" not in str(caught.value).lower()
    assert Secret("GITHUB_TOKEN").entry == "GITHUB_TOKEN" and Secret("gh_token").entry == "gh_token"
    with pytest.raises(ToolDefinitionError) as bad:
        Secret("Zq9SECRETvalue-7781xx")
    assert "Zq9" not in str(bad.value)
