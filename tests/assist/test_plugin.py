"""The repository is a valid Claude Code plugin marketplace with one plugin, `temper`, whose skills have valid frontmatter.

Schemas, as documented (read 2026-11 from the stored copies of the official pages):
- marketplace.json: https://code.claude.com/docs/en/plugins/marketplace-reference ("Top-level fields", "Plugin
  entries", "Plugin sources", "Reserved names"): at `.claude-plugin/marketplace.json`; required `name` (letters,
  digits, `.`, `_`, `-`, starting with a letter or digit, no `..`; not a reserved or impersonating name), `owner`
  (an object with a required `name`, optional `email`), `plugins` (an array of entries, each with a required
  `name` and `source`; a relative source is a path starting with `./` inside the marketplace's repository).
- plugin.json: https://code.claude.com/docs/en/plugins/manifest-reference: at `<plugin>/.claude-plugin/plugin.json`;
  `name` required, non-empty, without spaces, `@`, `:`, path separators or control characters, kebab-case, and
  not passing as one of Anthropic's own (`claude-*`, `anthropic-*`, ...); component folders (`skills/`, ...) at
  the plugin root, never inside `.claude-plugin/`.
- SKILL.md: https://agentskills.io/specification (also Claude Code's skills page): YAML frontmatter between `---`
  lines with `name` (1-64 characters, lowercase letters, digits and single hyphens, no leading or trailing hyphen,
  equal to the skill's folder name) and `description` (1-1024 characters, saying what the skill does and when to
  use it; Claude's page adds: no XML tags, no reserved words `anthropic` / `claude` in the name).
"""

import json
import re
from pathlib import Path

import pytest
import yaml

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]
SKILLS = ("doctor", "smoke-test", "run-milestone", "gate-check", "add-op-version", "launch-training", "diagnose-run",
          "explain-architecture")

_RESERVED_MARKETPLACES = {
    "claude-code-marketplace", "claude-code-plugins", "claude-plugins-official", "anthropic-marketplace",
    "anthropic-plugins", "agent-skills", "anthropic-agent-skills", "life-sciences", "knowledge-work-plugins",
    "claude-community", "claude-plugins-community", "anthropic-plugin-directory", "claude-plugin-directory", "inline",
    "builtin", "skills-dir", "synced", "claude-plugin-test", "npm", "pip", "uv", "cargo", "github", "gh"}
_MARKETPLACE_KEYS = {"$schema", "name", "owner", "metadata", "plugins", "description", "version"}
_ENTRY_KEYS = {"name", "source", "description", "version", "author", "homepage", "repository", "license", "keywords",
               "category", "tags", "strict", "commands", "agents", "hooks", "mcpServers", "lspServers", "skills"}
_MANIFEST_KEYS = {"$schema", "name", "version", "description", "author", "homepage", "repository", "license", "keywords",
                  "commands", "agents", "skills", "hooks", "mcpServers", "lspServers", "outputStyles", "userConfig"}
_KEBAB = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_SEMVER = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def marketplace_problems(data: object) -> list[str]:
    """Everything the documented schema says is wrong with a marketplace.json (empty: valid)."""
    if not isinstance(data, dict):
        return ["marketplace.json must be a JSON object"]
    problems = [f"unknown top-level field {k!r}" for k in sorted(set(data) - _MARKETPLACE_KEYS)]
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or ".." in name:
        problems.append(f"name {name!r}: letters, digits, '.', '_', '-', starting with a letter or digit, no '..'")
    elif name.lower() in _RESERVED_MARKETPLACES or re.match(r"(claude|anthropic)-plugins?(-|$)|claudeai-", name.lower()) \
            or re.search(r"official", name.lower()) and re.search(r"claude|anthropic", name.lower()):
        problems.append(f"name {name!r} is reserved or impersonates an official marketplace")
    owner = data.get("owner")
    if not isinstance(owner, dict) or not isinstance(owner.get("name"), str) or not owner["name"].strip():
        problems.append("owner must be an object with a non-empty name")
    elif not set(owner) <= {"name", "email", "url"}:
        problems.append(f"owner has unknown fields {sorted(set(owner) - {'name', 'email', 'url'})}")
    plugins = data.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        return problems + ["plugins must be a non-empty array of plugin entries"]
    for i, entry in enumerate(plugins):
        if not isinstance(entry, dict):
            problems.append(f"plugins[{i}] must be an object")
            continue
        problems += [f"plugins[{i}]: unknown field {k!r}" for k in sorted(set(entry) - _ENTRY_KEYS)]
        problems += [f"plugins[{i}].{p}" for p in _plugin_name_problems(entry.get("name"))]
        source = entry.get("source")
        if isinstance(source, str):
            if not source.startswith("./"):
                problems.append(f"plugins[{i}].source {source!r}: a relative source starts with './'")
        elif not (isinstance(source, dict) and source.get("source") in ("github", "url", "git-subdir", "npm")):
            problems.append(f"plugins[{i}].source must be './path' or a github / url / git-subdir / npm object")
    names = [e.get("name") for e in plugins if isinstance(e, dict)]
    problems += [f"plugin name {n!r} listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    return problems


def _plugin_name_problems(name: object) -> list[str]:
    if not isinstance(name, str) or not name:
        return ["name is required (a non-empty string)"]
    if re.search(r"[\s@:/\\\x00-\x1f]", name) or not _KEBAB.fullmatch(name):
        return [f"name {name!r} must be kebab-case (no spaces, '@', ':', path separators)"]
    parts = name.split("-")
    if name in ("claude", "anthropic", "anthropics", "claude-code", "claude-mods") or parts[0] in (
            "claude", "anthropic", "anthropics") or name.startswith("cc-plugin-") or (
            "official" in parts and {"claude", "anthropic"} & set(parts)):
        return [f"name {name!r} passes as one of Anthropic's own plugins"]
    return []


def manifest_problems(data: object) -> list[str]:
    if not isinstance(data, dict):
        return ["plugin.json must be a JSON object"]
    problems = [f"unknown field {k!r}" for k in sorted(set(data) - _MANIFEST_KEYS)]
    problems += _plugin_name_problems(data.get("name"))
    if "version" in data and not (isinstance(data["version"], str) and _SEMVER.fullmatch(data["version"])):
        problems.append(f"version {data['version']!r} is not semantic (MAJOR.MINOR.PATCH)")
    if "description" in data and not (isinstance(data["description"], str) and data["description"].strip()):
        problems.append("description must be a non-empty string")
    author = data.get("author")
    if author is not None and not (isinstance(author, dict) and isinstance(author.get("name"), str) and author["name"]):
        problems.append("author must be an object with a name")
    keywords = data.get("keywords")
    if keywords is not None and not (isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)):
        problems.append("keywords must be a list of strings")
    return problems


def frontmatter(path: Path) -> tuple[dict, str]:
    """(the YAML frontmatter, the body) of a SKILL.md; AssertionError when it has none."""
    text = path.read_text(encoding="utf-8")
    match = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.DOTALL)
    assert match, f"{path}: must start with YAML frontmatter between '---' lines"
    data = yaml.safe_load(match.group(1))
    assert isinstance(data, dict), f"{path}: the frontmatter must be a YAML mapping"
    return data, match.group(2)


def skill_problems(path: Path) -> list[str]:
    data, body = frontmatter(path)
    problems = []
    name, description = data.get("name"), data.get("description")
    if not (isinstance(name, str) and 1 <= len(name) <= 64 and _KEBAB.fullmatch(name)):
        problems.append(f"name {name!r}: 1-64 lowercase letters, digits and single hyphens")
    elif name != path.parent.name:
        problems.append(f"name {name!r} differs from its folder {path.parent.name!r}")
    elif {"anthropic", "claude"} & set(name.split("-")):
        problems.append(f"name {name!r} uses a reserved word")
    if not (isinstance(description, str) and 1 <= len(description) <= 1024):
        problems.append("description: 1-1024 characters")
    elif re.search(r"<[^>]+>", description):
        problems.append("description must not contain XML tags")
    elif not re.search(r"\bUse (when|before|after)\b", description):
        problems.append("description must say when to use the skill ('Use when / before / after ...')")
    unknown = set(data) - {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
    problems += [f"unknown frontmatter field {k!r}" for k in sorted(unknown)]
    if "## Success" not in body or "```bash" not in body:
        problems.append("the body must give the exact commands (a ```bash block) and a '## Success' section")
    return problems


PLUGIN = REPO / "plugins" / "temper"


def test_the_marketplace_lists_the_temper_plugin() -> None:
    """The plugin has a folder of its own: Claude Code copies a plugin's folder into its cache on install, and the
    repository root would bring runs/, data and checkpoints along."""
    data = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text(encoding="utf-8"))
    assert marketplace_problems(data) == []
    [entry] = data["plugins"]
    root = (REPO / entry["source"]).resolve()
    assert root == PLUGIN and root.is_relative_to(REPO)
    manifest = json.loads((root / ".claude-plugin" / "plugin.json").read_text(encoding="utf-8"))
    assert manifest_problems(manifest) == []
    assert manifest["name"] == entry["name"] == "temper"
    # Components live at the plugin root; .claude-plugin/ holds the manifest only.
    assert sorted(p.name for p in (root / ".claude-plugin").iterdir()) == ["plugin.json"]
    assert sorted(p.name for p in root.iterdir()) == [".claude-plugin", "skills"]
    assert sorted(p.name for p in (root / "skills").iterdir()) == sorted(SKILLS)


@pytest.mark.parametrize("skill", SKILLS)
def test_every_skill_has_valid_frontmatter_and_concrete_steps(skill: str) -> None:
    assert skill_problems(PLUGIN / "skills" / skill / "SKILL.md") == []


def test_the_checks_reject_what_the_schema_forbids(tmp_path: Path) -> None:
    """The validators above are not vacuous: each documented rule catches its violation."""
    good = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text(encoding="utf-8"))
    assert any("name" in p for p in marketplace_problems({**good, "name": "claude-plugins-official"}))
    assert any("name" in p for p in marketplace_problems({**good, "name": "my marketplace"}))
    assert any("owner" in p for p in marketplace_problems({**good, "owner": "me"}))
    assert any("plugins" in p for p in marketplace_problems({**good, "plugins": ["./"]}))
    assert any("source" in p for p in marketplace_problems({**good, "plugins": [{"name": "x", "source": "plugins/x"}]}))
    assert any("unknown" in p for p in marketplace_problems({**good, "plugin": []}))
    assert manifest_problems({"name": "Temper Tools"}) and manifest_problems({"name": "claude-tools"})
    assert manifest_problems({"name": "temper", "version": "1.0"})
    bad = tmp_path / "Doctor" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("---\nname: Doctor\ndescription: <b>checks</b>\n---\nno commands\n")
    assert len(skill_problems(bad)) == 3  # the name's case, the XML tag, no commands and no success section
    missing = tmp_path / "missing.md"
    missing.write_text("# no frontmatter\n")
    with pytest.raises(AssertionError, match="frontmatter"):
        frontmatter(missing)
