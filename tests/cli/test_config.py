"""``chatflow config show``: the settings a request would use."""

from __future__ import annotations

import re


def test_config_show_prints_the_model_requests_use(chatflow):
    r = chatflow("config", "show", env={"OPENAI_API_KEY": "sk-test-0123456789"})
    assert r.returncode == 0, r
    assert re.search(r"^model\s+gpt-4o-mini$", r.stdout, re.M), r.stdout
    assert re.search(r"^base_url\s+https://api.openai.com/v1$", r.stdout, re.M)
    assert "sk-test-0123456789" not in r.stdout
