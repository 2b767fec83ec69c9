"""recognition: the engine does not look at the machine or process it runs on, except where it must.

A judged run happens in a sandbox: a fresh pid namespace (tiny pids, a parent pid of 1), a read-only
checkout, no network but loopback, interpreter settings of the judge's choosing. Code that reads those
facts can behave well only when judged. The judge makes the facts the same for judged and user runs; this
rule is the static layer: in the packages guards.toml `[recognition] packages` names, reading a fact of
one of these families is a finding outside the files `[recognition] <family>` lists for it:

* process: pids, uids and gids, process groups and sessions, other processes (`os.getpid`, `os.getppid`,
  `os.getuid`, `os.kill`, `multiprocessing.parent_process`, `getpass`, `pwd`, `psutil`, `resource`, ...);
* network: interfaces, name resolution, sockets, HTTP (`socket.if_nameindex`, `socket.gethostbyname`,
  `socket.socket`, `fcntl.ioctl`, `netifaces`, `urllib.request`, ...);
* hostname: `socket.gethostname`, `socket.getfqdn`, `platform.node`, `platform.uname`, `os.uname`;
* writability: `os.access`, `os.statvfs`, `shutil.disk_usage`, `os.path.ismount`, `tempfile`;
* interpreter: `sys.flags`, `sys.dont_write_bytecode`, `sys.pycache_prefix`, `sys._xoptions`,
  `sys.warnoptions`, `sys.executable`, `sys.prefix` & co., `sys.gettrace`, `__debug__`, `isatty`, terminal
  size, `faulthandler`, `warnings.filters`;
* system-files: a string that spells a path into /proc, /sys, or the files that name the machine or its
  containers (`/etc/hostname`, `/proc/mounts`, `mountinfo`, `cgroup`, `/.dockerenv`), also in pieces
  (`Path("/", "proc", "self")`, f-strings, `+`, `%`).

Reads, not branches, are flagged: a value read in one place can decide a branch anywhere (through a
variable, a dict, a call), so "reads" is the rule that cannot be talked around, and the legitimate
readers are few (atomic temp names carry the pid, the run header names the host, an output folder is
checked for writability before a run). Names are resolved through imports, `as` and local aliases,
`getattr(module, "literal")` and literal dynamic imports; a fact module used as a value (`m = socket`,
passed on) and a string spelling a fact's name (`"getppid"`) are findings too, since either hides the read.
A file the allowlist names may read that family only; a one-off need is marked
`# guard: allow recognition -- <why>`.
"""

import ast
import re
from collections.abc import Iterator

from guards.astutil import Names, data_operands, is_builtin, literal_fragments, literal_head, names_of
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["RecognitionRule"]

_FACTS: dict[str, tuple[str, str]] = {
    **{f"os.{n}": ("process", "the process's identity") for n in (
        "getpid", "getppid", "getpgid", "getpgrp", "getsid", "getuid", "geteuid", "getgid", "getegid", "getgroups",
        "getresuid", "getresgid", "getlogin", "getpriority", "pidfd_open", "kill", "killpg", "sched_getaffinity",
        "getloadavg")},
    **{f"multiprocessing.{n}": ("process", "the process's identity") for n in ("current_process", "parent_process",
                                                                                 "active_children")},
    "threading.get_native_id": ("process", "the thread's system id"),
    **{m: ("process", "users, processes or limits of the machine") for m in ("getpass", "pwd", "grp", "psutil",
                                                                               "resource")},
    **{f"socket.{n}": ("network", "network interfaces or names") for n in (
        "if_nameindex", "if_nametoindex", "if_indextoname", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
        "getaddrinfo", "getnameinfo", "socket", "create_connection", "create_server")},
    **{m: ("network", "network interfaces or the network") for m in ("netifaces", "fcntl.ioctl", "urllib.request",
                                                                     "http.client", "requests", "httpx", "_socket")},
    **{n: ("hostname", "the machine's name") for n in ("socket.gethostname", "socket.getfqdn", "platform.node",
                                                       "platform.uname", "os.uname")},
    **{f"os.{n}": ("writability", "what the file system lets the process write") for n in (
        "access", "statvfs", "fstatvfs", "path.ismount")},
    "shutil.disk_usage": ("writability", "what the file system lets the process write"),
    "tempfile": ("writability", "where temporary files go and whether they can be made"),
    **{f"sys.{n}": ("interpreter", "how the interpreter was started") for n in (
        "flags", "dont_write_bytecode", "pycache_prefix", "_xoptions", "warnoptions", "executable", "_base_executable",
        "prefix", "base_prefix", "exec_prefix", "base_exec_prefix", "gettrace", "getprofile", "ps1", "orig_argv")},
    **{n: ("interpreter", "whether a terminal is attached") for n in ("os.isatty", "os.get_terminal_size",
                                                                      "shutil.get_terminal_size")},
    "faulthandler": ("interpreter", "how the interpreter was started"),
    "warnings.filters": ("interpreter", "how the interpreter was started"),
}
# Modules of machine facts, by the family a value of one of them gives access to.
_FACT_MODULES = {**dict.fromkeys(("os", "posix", "nt", "psutil", "resource", "getpass", "multiprocessing"), "process"),
                 **dict.fromkeys(("socket", "netifaces", "fcntl"), "network"), "platform": "hostname",
                 **dict.fromkeys(("tempfile", "shutil"), "writability"),
                 **dict.fromkeys(("sys", "faulthandler"), "interpreter")}
# Fact names distinctive enough that a string spelling one is a way to it (`vars(os)["getppid"]`).
_SPELLED = {q.rpartition(".")[2]: family for q, (family, _) in _FACTS.items()
            if "." in q and q.rpartition(".")[2] not in ("socket", "access", "flags", "prefix", "kill", "filters",
                                                         "executable", "node", "uname", "request", "client")}
_PATH_PIECES = re.compile(r"(^|/)(proc|sys/(class|devices|fs|kernel)|etc/(hostname|hosts|mtab|machine-id|resolv\.conf)|"
                          r"mounts|mountinfo|cgroups?|\.dockerenv|\.containerenv)(/|$)|^/sys(/|$)")
_BARE_PIECES = frozenset({"proc", "sys", "hostname", "mounts", "mountinfo", "cgroup", "net", ".dockerenv"})
_RECOGNITION_FIX = ("a run must behave the same wherever and however it is started; drop the read, or a reviewer "
                    "lists this file under guards.toml [recognition] {family} (or marks the line "
                    "`# guard: allow recognition -- <why>`)")


def _fact_of(qualified: str) -> tuple[str, str, str] | None:
    """(the fact's name, family, what it tells) for a qualified name, else None."""
    if qualified.split(".", 1)[0] in ("posix", "nt"):
        qualified = "os" + qualified[len(qualified.split(".", 1)[0]):]
    hit = next((q for q in _FACTS if qualified == q or qualified.startswith(q + ".")), None)
    return (hit, *_FACTS[hit]) if hit is not None else None


class RecognitionRule(Rule):
    id = "recognition"
    summary = "engine code never reads the facts a judged run can be told by (pids, network, host, writability, flags)"

    def check(self, module: SourceModule) -> Iterator[Finding]:
        settings = self.config.recognition
        if module.package not in settings.packages:
            return
        for line, col, family, message in _Scan(module).findings():
            if not settings.allows(family, module.relpath):
                yield module.finding(self.id, f"{message} ({family}): " + _RECOGNITION_FIX.format(family=family),
                                     line=line, col=col)


class _Scan:
    def __init__(self, module: SourceModule):
        self.module = module
        self.names: Names = names_of(module)
        self.imports = self.names.imports
        self.lines: set[tuple[int, str]] = set()

    def _hit(self, node: ast.AST, family: str, message: str) -> Iterator[tuple[int, int, str, str]]:
        key = (node.lineno, family)
        if key not in self.lines:
            self.lines.add(key)
            yield node.lineno, node.col_offset + 1, family, message

    def findings(self) -> Iterator[tuple[int, int, str, str]]:
        yield from self._references()
        yield from self._handles()
        yield from self._strings()

    def _references(self) -> Iterator[tuple[int, int, str, str]]:
        found = []
        for node in (*self.module.nodes(ast.Attribute), *self.module.nodes(ast.Name)):
            qualified = self.names.qualify(node)
            if qualified is not None and (fact := _fact_of(qualified)) is not None:
                found.append((len(qualified), node, fact))
            elif isinstance(node, ast.Name) and node.id == "__debug__":
                found.append((0, node, ("__debug__", "interpreter", "how the interpreter was started (-O)")))
            elif isinstance(node, ast.Attribute) and node.attr == "isatty":
                found.append((0, node, (".isatty", "interpreter", "whether a terminal is attached")))
        for call in self.module.nodes(ast.Call):
            if is_builtin(call.func, "getattr", self.imports) and len(call.args) >= 2:
                base, name = self.names.qualify(call.args[0]), literal_head(call.args[1])
                if base is not None and name is not None and name[1] and (fact := _fact_of(f"{base}.{name[0]}")):
                    found.append((99, call, fact))
        for import_from in self.module.nodes(ast.ImportFrom):
            if import_from.module in _FACT_MODULES and any(a.name == "*" for a in import_from.names):
                found.append((0, import_from, (f"from {import_from.module} import *", _FACT_MODULES[import_from.module],
                                               "every name of a module of machine facts, unseen")))
        for _, node, (name, family, what) in sorted(found, key=lambda f: -f[0]):
            yield from self._hit(node, family, f"`{name}` reads {what}")

    def _handles(self) -> Iterator[tuple[int, int, str, str]]:
        """A fact module used as a value (`m = socket`, `f(sys)`): its facts are then read under names this rule cannot see."""
        bases = {id(n.value) for n in self.module.nodes(ast.Attribute)}
        bases |= {id(c.args[0]) for c in self.module.nodes(ast.Call) if c.args and is_builtin(c.func, "getattr", self.imports)}
        for node in self.module.nodes(ast.Name):
            target = self.imports.bindings.get(node.id)
            if target in _FACT_MODULES and isinstance(node.ctx, ast.Load) and id(node) not in bases:
                yield from self._hit(node, _FACT_MODULES[target], f"uses the {target} module as a value (aliased, passed on), so what "
                                                      "it is asked about the machine cannot be followed; use "
                                                      f"`{target}.<name>` directly")

    def _strings(self) -> Iterator[tuple[int, int, str, str]]:
        module = self.module
        consumed = set(data_operands(module))
        nodes = [*module.nodes(ast.Constant), *module.nodes(ast.JoinedStr), *module.nodes(ast.BinOp)]
        for node in nodes:
            pieces = literal_fragments(node) if not isinstance(node, ast.Constant) else \
                [node.value] if isinstance(node.value, str) else [node.value.decode("latin-1")] if isinstance(node.value, bytes) else []
            for text in pieces:
                if _PATH_PIECES.search(text) or text.strip("/") in _BARE_PIECES:
                    yield from self._hit(node, "system-files", f"the string {text[:60]!r} spells a path into /proc, /sys "
                                                               "or a file that names the machine or its sandbox")
                    break
                if isinstance(node, ast.Constant) and id(node) not in consumed and text in _SPELLED:
                    yield from self._hit(node, _SPELLED[text], f"the string {text!r} names a fact of the process or machine; "
                                                          "reaching it by name hides the read")
                    break
