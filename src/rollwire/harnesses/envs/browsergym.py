"""BrowserGym / MiniWoB as agent tools: ``browsergym:miniwob.click-test`` and the other MiniWoB tasks.

The agent sees the task's goal and the page's accessibility tree (each actionable element marked
with its BrowserGym id, ``[13]``) and acts through five tools: ``click``, ``fill``, ``send_keys``,
``scroll`` and ``noop``. Tool arguments are validated, then encoded as BrowserGym's high-level
action strings with Python's own literal encoder (``repr``) and parsed back by BrowserGym's strict
parser: agent text never becomes code. The reward is the task's own, forwarded.

Playwright's sync API is bound to the thread that started it, so each episode owns one thread
(a single-worker executor) with its own Playwright: every browser call of the episode runs there,
in order, and the async session awaits it. Two things in BrowserGym 0.14.3 are redirected, only
on these episode threads (other users of BrowserGym in the process are untouched):

* its global Playwright, so that the browser launches Debian's ``/usr/bin/chromium`` (Playwright
  cannot download its own here) headless with the flags a closed network needs;
* its chat window, a second Chromium the agent never sees (MiniWoB never reads it), replaced by
  an in-memory message list: one browser per episode instead of two.

Needs the ``browser`` extra and Debian's chromium (``apt-get install chromium``).
"""

from __future__ import annotations

import concurrent.futures
import difflib
import math
import os
import re
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import anyio

from rollwire.extras import install_hint
from rollwire.harnesses.envs.registry import TaskError, TaskInfo, check_answer_mode
from rollwire.sessions.base import (
    AnswerMode,
    EnvVerdict,
    ResourceSession,
    ToolResult,
    ToolSpec,
    refuse_reserved,
    refused_call,
)
from rollwire.sessions.stepenv import ActionTool, StepOutcome, ToolArgumentError

__all__ = [
    "CHROMIUM",
    "CHROMIUM_FLAGS",
    "DEFAULT_CONFIG",
    "TOOLS",
    "BrowserGymAdapter",
    "BrowserGymSession",
    "MiniWoBEnv",
    "chromium_missing",
    "encode_action",
    "miniwob_base_url",
]

FAMILY = "browsergym"
CHROMIUM = "/usr/bin/chromium"
# As root on a closed network: no sandbox, no GPU, and none of Chromium's background calls home.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
INSTALL_HINT = "BrowserGym needs Debian chromium: apt-get install chromium"
EXTRA_HINT = install_hint("browser")

DEFAULT_CONFIG: dict[str, Any] = {
    "max_obs_chars": 6000,  # the accessibility tree is cut beyond this
    "pre_observation_delay": 0.5,  # BrowserGym's wait for page scripts after each action (s)
}

INSTRUCTIONS = (
    "You are operating a web page to accomplish a goal. The page is shown as an accessibility "
    "tree; each element you can act on has an id in square brackets, e.g. [13]. Act with the "
    "tools: click(bid), fill(bid, value), send_keys(keys), scroll(delta_x, delta_y), noop()."
)

_BID = re.compile(r"[A-Za-z]{0,16}[0-9]{1,9}")
_MAX_TEXT = 10_000
_MAX_KEYS = 100
_MAX_SCROLL = 10_000.0


# --------------------------------------------------------------------------- tools


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_BID_PROP = {"type": "string", "description": "the element's id, from [brackets] in the tree"}

TOOL_SPECS = (
    ToolSpec(
        name="click",
        description="Click the page element with the given bid.",
        input_schema=_schema({"bid": _BID_PROP}, ["bid"]),
    ),
    ToolSpec(
        name="fill",
        description="Replace the text of an input field or text area with `value`.",
        input_schema=_schema(
            {"bid": _BID_PROP, "value": {"type": "string", "description": "the text to enter"}},
            ["bid", "value"],
        ),
    ),
    ToolSpec(
        name="send_keys",
        description=(
            "Press a key or key combination on the focused element, "
            "e.g. 'Enter', 'Tab', 'Backspace', 'ArrowDown', 'Control+a'."
        ),
        input_schema=_schema({"keys": {"type": "string", "description": "the key(s)"}}, ["keys"]),
    ),
    ToolSpec(
        name="scroll",
        description="Scroll the page by pixels: positive is right/down, negative is left/up.",
        input_schema=_schema(
            {"delta_x": {"type": "number"}, "delta_y": {"type": "number"}},
            ["delta_x", "delta_y"],
        ),
    ),
    ToolSpec(
        name="noop",
        description="Do nothing for a second (wait for the page to change).",
        input_schema=_schema({}, []),
    ),
)


def _only(args: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(args) - set(allowed))
    if extra:
        raise ToolArgumentError(
            f"unexpected argument(s) {extra}; expected {list(allowed) or 'none'}"
        )


def _bid(args: dict[str, Any]) -> str:
    bid = args.get("bid")
    if isinstance(bid, int) and not isinstance(bid, bool) and bid >= 0:
        bid = str(bid)
    if not isinstance(bid, str) or not _BID.fullmatch(bid.strip()):
        raise ToolArgumentError(
            f"'bid' must be an element id from the page's tree, like '13', got {bid!r}"
        )
    return bid.strip()


def _text(args: dict[str, Any], key: str, limit: int, *, empty: bool) -> str:
    value = args.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ToolArgumentError(f"'{key}' must be a string, got {value!r}")
    if not empty and not value:
        raise ToolArgumentError(f"'{key}' must not be empty")
    if len(value) > limit:
        raise ToolArgumentError(f"'{key}' is too long ({len(value)} characters, at most {limit})")
    return value


def _number(args: dict[str, Any], key: str) -> float:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ToolArgumentError(f"'{key}' must be a number of pixels, got {value!r}")
    if abs(value) > _MAX_SCROLL:
        raise ToolArgumentError(f"'{key}' must be within ±{_MAX_SCROLL:g} pixels, got {value!r}")
    return float(value)


def encode_action(name: str, args: dict[str, Any]) -> str:
    """Validated tool arguments -> one BrowserGym high-level action string.

    Strings are encoded with ``repr`` (a Python literal BrowserGym's strict parser reads back to
    the same value), numbers as floats: agent input is never spliced in raw. Raises
    :class:`ToolArgumentError` with a message for the agent.
    """
    if not isinstance(args, dict):
        raise ToolArgumentError(f"arguments must be a JSON object, got {type(args).__name__}")
    if name == "click":
        _only(args, ("bid",))
        return f"click({_bid(args)!r})"
    if name == "fill":
        _only(args, ("bid", "value"))
        return f"fill({_bid(args)!r}, {_text(args, 'value', _MAX_TEXT, empty=True)!r})"
    if name == "send_keys":
        _only(args, ("keys",))
        return f"keyboard_press({_text(args, 'keys', _MAX_KEYS, empty=False)!r})"
    if name == "scroll":
        _only(args, ("delta_x", "delta_y"))
        return f"scroll({_number(args, 'delta_x')!r}, {_number(args, 'delta_y')!r})"
    if name == "noop":
        _only(args, ())
        return "noop()"
    raise ToolArgumentError(f"unknown action {name!r}")


def _action_tool(spec: ToolSpec) -> ActionTool:
    return ActionTool(spec, lambda args, _name=spec.name: encode_action(_name, args))


TOOLS: tuple[ActionTool, ...] = tuple(_action_tool(spec) for spec in TOOL_SPECS)


# --------------------------------------------------------------------------- availability


def chromium_missing() -> str | None:
    """Why no browser can start here, or None when Debian's chromium is installed."""
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return None
    return f"{INSTALL_HINT} ({CHROMIUM} not found)"


def _miniwob_tasks() -> dict[str, Any]:
    """Task id (``miniwob.click-test``) -> task class; TaskError when the extra is missing."""
    try:
        return _load_miniwob_tasks()
    except ImportError as exc:
        raise TaskError(f"BrowserGym/MiniWoB is not installed ({exc}): {EXTRA_HINT}") from exc


@lru_cache(maxsize=1)
def _load_miniwob_tasks() -> dict[str, Any]:
    import gymnasium as gym
    from browsergym.miniwob import ALL_MINIWOB_TASKS  # registers the gym ids on import

    registered = {
        env_id.removeprefix("browsergym/")
        for env_id in gym.envs.registry
        if env_id.startswith("browsergym/miniwob.")
    }
    tasks = {cls.get_task_id(): cls for cls in ALL_MINIWOB_TASKS}
    return {name: tasks[name] for name in sorted(registered) if name in tasks}


def miniwob_base_url() -> str:
    """Where MiniWoB's task pages are: ``$MINIWOB_URL``, else the ``miniwob`` package's own
    html directory over ``file://`` (no web server needed)."""
    configured = os.environ.get("MINIWOB_URL")
    if configured:
        return configured if configured.endswith("/") else configured + "/"
    try:
        import miniwob
    except ImportError as exc:
        raise TaskError(f"the miniwob package is not installed ({exc}): {EXTRA_HINT}") from exc
    pages = Path(miniwob.__file__).resolve().parent / "html" / "miniwob"
    if not pages.is_dir():
        raise TaskError(f"the miniwob package has no task pages at {pages}")
    return pages.as_uri() + "/"


# --------------------------------------------------------------------------- BrowserGym patches

_episode = threading.local()  # .playwright on an episode thread: that thread's own Playwright
_patch_lock = threading.Lock()


class _Chromium:
    """Playwright's chromium launcher, forced onto Debian's binary with our flags."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def launch(self, **kwargs: Any) -> Any:
        kwargs["executable_path"] = CHROMIUM
        kwargs["headless"] = True
        kwargs["args"] = [*(kwargs.get("args") or []), *CHROMIUM_FLAGS]
        return self._real.launch(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Playwright:
    """One episode thread's Playwright as BrowserGym sees it (launches go through _Chromium)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.chromium = _Chromium(real.chromium)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _SilentChat:
    """BrowserGym's chat without its browser window: the same message list, nothing on screen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.messages: list[dict[str, Any]] = []

    def add_message(self, role: str, msg: str) -> None:
        if role not in ("user", "user_image", "assistant", "info", "infeasible"):
            raise ValueError(f"Invalid role: {role}")
        if role != "info":
            self.messages.append({"role": role, "timestamp": time.time(), "message": msg})

    def wait_for_user_message(self) -> None:
        raise RuntimeError("no user is attached to this episode's chat")

    def close(self) -> None:
        pass


def _install_patches() -> None:
    """Redirect BrowserGym's Playwright and chat on episode threads only (idempotent)."""
    from browsergym.core import env as bg_env

    with _patch_lock:
        if getattr(bg_env, "_rollwire_patched", False):
            return
        original_playwright = bg_env._get_global_playwright
        original_chat = bg_env.Chat

        def get_playwright() -> Any:
            mine = getattr(_episode, "playwright", None)
            return mine if mine is not None else original_playwright()

        def chat(*args: Any, **kwargs: Any) -> Any:
            if getattr(_episode, "playwright", None) is not None:
                return _SilentChat(*args, **kwargs)
            return original_chat(*args, **kwargs)

        bg_env._get_global_playwright = get_playwright
        bg_env.Chat = chat
        bg_env._rollwire_patched = True


# --------------------------------------------------------------------------- the environment


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... [{len(text) - limit} more characters cut]"


class MiniWoBEnv:
    """One MiniWoB episode behind the StepEnv protocol. Blocking: every method must run on the
    same thread (the session's episode thread), which owns this episode's Playwright."""

    def __init__(self, task_class: Any, base_url: str, config: dict[str, Any]) -> None:
        self.task_class = task_class
        self.base_url = base_url
        self.max_obs_chars = int(config["max_obs_chars"])
        self.pre_observation_delay = float(config["pre_observation_delay"])
        self.env: Any = None
        self._playwright: Any = None
        self.goal = ""
        self.url = ""
        self.last_error = ""
        self.task_info: dict[str, Any] = {}

    def reset(self, seed: int | None) -> StepOutcome:
        from browsergym.core.action.highlevel import HighLevelActionSet
        from browsergym.core.env import BrowserEnv
        from playwright.sync_api import sync_playwright

        _install_patches()
        self.close()  # a second reset starts over
        self._playwright = sync_playwright().start()
        _episode.playwright = _Playwright(self._playwright)
        # Strict: exactly one call, parsed back to literals and re-encoded by BrowserGym.
        actions = HighLevelActionSet(subsets=["bid", "coord"], strict=True, multiaction=False)
        self.env = BrowserEnv(
            self.task_class,
            task_kwargs={"base_url": self.base_url},
            headless=True,
            action_mapping=actions.to_python_code,
            pre_observation_delay=self.pre_observation_delay,
        )
        obs, info = self.env.reset(seed=seed)
        self.task_info = dict(info.get("task_info") or {})
        return StepOutcome(observation=self._observe(obs), info={"task_info": self.task_info})

    def step(self, action: str) -> StepOutcome:
        if self.env is None:
            raise RuntimeError("the episode was not started")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.task_info = dict(info.get("task_info") or {})
        text = self._observe(obs)  # also reads the action's error, if any
        return StepOutcome(
            observation=text,
            reward=float(reward),
            done=bool(terminated or truncated),
            info={"task_info": self.task_info, "last_action_error": self.last_error},
        )

    def state(self) -> dict[str, Any]:
        return {
            "task": self.task_class.get_task_id(),
            "url": self.url,
            "goal": self.goal,
            "task_info": dict(self.task_info),
        }

    def close(self) -> None:
        try:
            if self.env is not None:
                self.env.close()
        finally:
            self.env = None
            try:
                if self._playwright is not None:
                    self._playwright.stop()
            finally:
                self._playwright = None
                _episode.playwright = None

    def _observe(self, obs: dict[str, Any]) -> str:
        from browsergym.utils.obs import (
            IGNORED_AXTREE_PROPERTIES,
            IGNORED_AXTREE_ROLES,
            flatten_axtree_to_str,
        )

        self.goal = str(obs.get("goal") or "")
        self.url = str(obs.get("url") or "")
        self.last_error = str(obs.get("last_action_error") or "")
        tree = flatten_axtree_to_str(
            obs["axtree_object"],
            ignored_roles=[*IGNORED_AXTREE_ROLES, "InlineTextBox"],
            ignored_properties=(*IGNORED_AXTREE_PROPERTIES, "url"),
        )
        parts = [f"Goal: {self.goal}"]
        if self.last_error:
            parts.append(f"Last action error: {self.last_error}")
        parts.append(f"Page:\n{_truncate(tree.strip(), self.max_obs_chars)}")
        return "\n\n".join(parts)


# --------------------------------------------------------------------------- the session


class BrowserGymSession(ResourceSession):
    """One episode: tools in, BrowserGym steps on the episode's own thread, observations out."""

    def __init__(
        self,
        env: MiniWoBEnv,
        *,
        tools: tuple[ActionTool, ...] = TOOLS,
        seed: int | None = None,
        instructions: str = INSTRUCTIONS,
        episode_id: str = "",
    ) -> None:
        for tool in tools:
            refuse_reserved(tool.spec.name)
        self.env = env
        self.seed = seed
        self.instructions = instructions
        self._by_name = {t.spec.name: t for t in tools}
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"browsergym-{episode_id[:12]}"
        )
        # Our own waiter slot: episodes never queue behind each other for anyio's shared pool.
        self._waiter = anyio.CapacityLimiter(1)
        self._started = False
        self._closed = False
        self.done = False
        self.failed: str | None = None
        self.steps = 0
        self.final_reward: float | None = None
        self.task_info: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the episode thread; an abandoned await leaves it queued, in order."""
        future = self._thread.submit(fn, *args)
        return await anyio.to_thread.run_sync(
            future.result, abandon_on_cancel=True, limiter=self._waiter
        )

    async def initial_messages(self) -> list[dict[str, Any]]:
        """Launch the browser, open the task page, show the goal and the page."""
        if self._closed:
            raise RuntimeError("the session is closed")
        self._started = True
        start = time.perf_counter()
        first: StepOutcome = await self._on_thread(self.env.reset, self.seed)
        self.timings["reset_s"] = round(time.perf_counter() - start, 4)
        self.task_info = dict(first.info.get("task_info") or {})
        return [{"role": "user", "content": f"{self.instructions}\n\n{first.observation}"}]

    def list_tools(self) -> list[ToolSpec]:
        return [t.spec for t in self._by_name.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One action; bad arguments, BrowserGym's action errors and a finished episode are tool
        errors the agent reads. A browser failure ends the episode with no verdict."""
        refused = refused_call(name, self._by_name, done=self.done or self._closed)
        if refused is not None:
            return refused
        tool = self._by_name[name]
        if not self._started:
            msg = "the episode has not started"
            return ToolResult(content=msg, error=msg)
        try:
            action = tool.to_action(arguments)
        except ToolArgumentError as exc:
            return ToolResult(content=f"invalid arguments: {exc}", error=str(exc))
        try:
            outcome: StepOutcome = await self._on_thread(self.env.step, action)
        except Exception as exc:  # the browser broke: end the episode, visibly
            self.failed = f"{type(exc).__name__}: {exc}"
            self.done = True
            msg = f"environment error: {self.failed}"
            return ToolResult(content=msg, error=msg, done=True)
        self.steps += 1
        self.task_info = dict(outcome.info.get("task_info") or {})
        self.done = outcome.done
        content = outcome.observation
        if self.done:
            self.final_reward = outcome.reward
            content += "\n\nThe episode has ended."
        return ToolResult(
            content=content,
            done=self.done,
            reward=outcome.reward,
            error=outcome.info.get("last_action_error") or None,
            metadata={"action": action, "task_info": self.task_info},
        )

    async def verify(self) -> EnvVerdict:
        """The task's own reward once the episode ended (None before, or after a failure)."""
        metrics: dict[str, Any] = {"steps": self.steps, **self.timings}
        if self.failed is not None:
            return EnvVerdict(
                reward=None,
                metrics=metrics,
                reason=f"the environment failed mid-episode: {self.failed}",
            )
        if not self.done or self.final_reward is None:
            return EnvVerdict(
                reward=None, metrics=metrics, reason="the episode did not reach its end"
            )
        rewards = {"reward": self.final_reward}
        for key, name in (("RAW_REWARD_GLOBAL", "miniwob_raw"), ("REWARD_GLOBAL", "miniwob")):
            value = self.task_info.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                rewards[name] = float(value)
        reason = self.task_info.get("REWARD_REASON")
        return EnvVerdict(
            reward=self.final_reward,
            rewards=rewards,
            metrics=metrics,
            reason=str(reason) if reason else None,
        )

    async def close(self) -> None:
        """Close the browser and its Playwright on the episode thread, then end the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._started:
                await self._on_thread(self.env.close)
        finally:
            await anyio.to_thread.run_sync(self._thread.shutdown)


# --------------------------------------------------------------------------- the adapter


def _config(config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise TaskError(
            f"unknown browsergym config key(s) {unknown}; known: {sorted(DEFAULT_CONFIG)}"
        )
    merged = {**DEFAULT_CONFIG, **config}
    chars = merged["max_obs_chars"]
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 200:
        raise TaskError(f"max_obs_chars must be an integer >= 200, got {chars!r}")
    delay = merged["pre_observation_delay"]
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 10:
        raise TaskError(f"pre_observation_delay must be between 0 and 10 seconds, got {delay!r}")
    return merged


class BrowserGymAdapter:
    """The ``browsergym`` family: BrowserGym's registered MiniWoB tasks."""

    family = FAMILY
    answer_modes: tuple[AnswerMode, ...] = ("tool",)  # moves and actions, no answers

    def list_tasks(self) -> list[TaskInfo]:
        """Every registered MiniWoB task (no browser needed to list them)."""
        return [
            TaskInfo(
                task=f"{FAMILY}:{name}",
                family=FAMILY,
                description=str(getattr(cls, "desc", "") or name),
                config_example=dict(DEFAULT_CONFIG),
            )
            for name, cls in _miniwob_tasks().items()
        ]

    def make_session(
        self,
        name: str,
        config: dict[str, Any],
        *,
        seed: int | None,
        episode_id: str,
        answer_mode: AnswerMode = "tool",
    ) -> ResourceSession:
        """A session for one task; nothing starts until its first message is asked for."""
        check_answer_mode(self, answer_mode)
        tasks = _miniwob_tasks()
        task_class = tasks.get(name)
        if task_class is None:
            close = difflib.get_close_matches(name, list(tasks), n=3)
            hint = f"; did you mean {close}?" if close else ""
            raise TaskError(
                f"unknown BrowserGym task {name!r}{hint} ({len(tasks)} MiniWoB tasks, "
                "e.g. 'miniwob.click-test'; list them with list_tasks)"
            )
        merged = _config(dict(config))
        missing = chromium_missing()
        if missing:
            raise TaskError(missing)
        env = MiniWoBEnv(task_class, miniwob_base_url(), merged)
        return BrowserGymSession(env, seed=seed, episode_id=episode_id)
