"""``chatflow config show``: the settings a request would use."""

from __future__ import annotations

import re


def test_config_show_prints_the_model_requests_use(chatflow):
    r = chatflow("config", "show", env={"OPENAI_API_KEY": "sk-test-0123456789"})
    assert r.returncode == 0, r
    assert re.search(r"^model\s+gpt-4o-mini$", r.stdout, re.M), r.stdout
    assert re.search(r"^base_url\s+https://api.openai.com/v1$", r.stdout, re.M)
    assert "sk-test-0123456789" not in r.stdout


def test_config_show_lists_every_setting_in_effect_with_its_source(chatflow, config_file):
    config_file('message_id_scope = "session"\nlocal_keep_alive = "10m"\n')
    r = chatflow("config", "show", env={"CHATFLOW_TRANSPORT": "openai"})
    assert r.returncode == 0, r
    assert re.search(r"^message_id_scope\s+session$", r.stdout, re.M), r.stdout
    assert re.search(r"^message_id_scope_source\s+file$", r.stdout, re.M), r.stdout
    assert re.search(r"^local_keep_alive\s+600\.0$", r.stdout, re.M), r.stdout
    assert re.search(r"^local_keep_alive_source\s+file$", r.stdout, re.M), r.stdout
    assert re.search(r"^transport\s+openai$", r.stdout, re.M), r.stdout
    assert re.search(r"^transport_source\s+env \$CHATFLOW_TRANSPORT$", r.stdout, re.M), r.stdout


def test_config_show_json_has_the_defaults_of_scope_and_transport(chatflow):
    import json

    r = chatflow("config", "show", "--json", env={"CHATFLOW_TRANSPORT": ""})
    assert r.returncode == 0, r
    data = json.loads(r.stdout)
    assert data["message_id_scope"] == "global"
    assert data["message_id_scope_source"] == "default"
    assert data["transport"] == "http (chat, replay --rerun), openai (REPL)"
    assert data["transport_source"] == "default"


def test_config_show_lists_the_context_settings_with_their_sources(chatflow, config_file):
    import json

    default = json.loads(chatflow("config", "show", "--json").stdout)
    assert default["max_context_tokens"] is None and default["max_context_tokens_source"].startswith("default")
    assert default["compact_at"] == 0.8 and default["compact_at_source"] == "default"
    assert default["compact_prompt"] is None and default["compact_prompt_source"].startswith("default")
    config_file('max_context_tokens = 4096\ncompact_at = 0\ncompact_prompt = "Keep ids."\n')
    r = chatflow("config", "show")
    assert r.returncode == 0, r
    assert re.search(r"^max_context_tokens\s+4096$", r.stdout, re.M), r.stdout
    assert re.search(r"^max_context_tokens_source\s+file$", r.stdout, re.M), r.stdout
    assert re.search(r"^compact_at\s+off$", r.stdout, re.M), r.stdout
    assert re.search(r"^compact_at_source\s+file$", r.stdout, re.M), r.stdout
    assert re.search(r"^compact_prompt\s+Keep ids\.$", r.stdout, re.M), r.stdout
    assert re.search(r"^compact_prompt_source\s+file$", r.stdout, re.M), r.stdout
