"""The graph of a workflow's steps: who needs whom (docs/reference/workflows.md, "Graphs")."""

# A step's `needs` lists the ids of the steps it waits for. Absent, it is the step listed just before it (none for
# the first), so a plain list runs in order exactly as before; `[]` lets it start at once.
#
# Pure functions over the definition's list of steps: no database. They tolerate a definition that has
# not passed validation (graph_problems names what is wrong with it); needs_of, ancestors_of and order are meant
# for one that has.

import heapq
import re
from collections.abc import Container
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from .steps.base import NAME_RE

__all__ = ["ancestors_of", "graph_problems", "needs_of", "order"]


@dataclass
class _Graph:
    """The steps by list index. Built by index, not id, so that a step with a bad or duplicate id still has its
    place (and its default need) while validation reports it."""

    ids: list[str | None]  # the step's id, None when it has no usable one
    needs: list[list[int]]  # indexes of the steps it needs (known ids only, duplicates dropped)
    implicit: list[bool]  # True when needs was absent (the step listed just before it)

    @property
    def size(self) -> int:
        return len(self.ids)


CODE_STEP_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,60}(#[0-9]{1,9})?$")


def _step_id(step: Any) -> str | None:
    """The step's id, or None when it has no valid one (validation names that; the step still has its place)."""
    if isinstance(step, dict) and isinstance(step.get("id"), str):
        if NAME_RE.match(step["id"]) or CODE_STEP_ID_RE.match(step["id"]):  # a Python workflow's: name#n
            return step["id"]
    return None


def _build(steps: list) -> _Graph:
    ids = [_step_id(step) for step in steps]
    index_of: dict[str, int] = {}
    for index, step_id in enumerate(ids):
        if step_id is not None:
            index_of.setdefault(step_id, index)  # a duplicate id: the first holder (validation names the second)
    needs: list[list[int]] = []
    implicit: list[bool] = []
    for index, step in enumerate(steps):
        if isinstance(step, dict) and "needs" in step:
            raw = step["needs"]
            wanted = [n for n in raw if isinstance(n, str)] if isinstance(raw, list) else []
            needs.append(list(dict.fromkeys(index_of[n] for n in wanted if n in index_of)))
            implicit.append(False)
        else:
            needs.append([index - 1] if index > 0 else [])
            implicit.append(True)
    return _Graph(ids=ids, needs=needs, implicit=implicit)


def _topological(graph: _Graph) -> tuple[list[int], list[int]]:
    """Kahn's walk, always taking the ready step listed first: for a plain list that is the list order itself.
    Returns (the order, the steps it could not reach: those on a cycle or behind one)."""
    waiting = [len(set(needs)) for needs in graph.needs]
    dependents: list[list[int]] = [[] for _ in range(graph.size)]
    for index, needs in enumerate(graph.needs):
        for need in set(needs):
            dependents[need].append(index)
    ready = [index for index in range(graph.size) if waiting[index] == 0]
    heapq.heapify(ready)
    walked: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        walked.append(index)
        for dependent in dependents[index]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                heapq.heappush(ready, dependent)
    reached = set(walked)
    return walked, [index for index in range(graph.size) if index not in reached]


def _ancestor_bits(graph: _Graph) -> list[int]:
    """Each step's transitive needs as a bit set over list indexes (bit i: step i). Bit sets keep a plain list of
    10,000 steps cheap (sets of ids would hold 50 million entries)."""
    walked, stuck = _topological(graph)
    bits = [0] * graph.size
    for index in walked:
        for need in graph.needs[index]:
            bits[index] |= bits[need] | (1 << need)
    for index in stuck:  # on or behind a cycle: a plain search (validation refuses these anyway)
        seen, todo = 0, list(graph.needs[index])
        while todo:
            need = todo.pop()
            if not seen >> need & 1:
                seen |= 1 << need
                todo.extend(graph.needs[need])
        bits[index] = seen
    return bits


class Ancestry:
    """Answers "is B among A's ancestors?" for every step of a definition, by list index, without building a
    set per step. Used by validation; ancestors_of is the set-per-step view of the same thing."""

    def __init__(self, steps: list):
        self._graph = _build(steps)
        self._bits = _ancestor_bits(self._graph)
        self._index_of: dict[str, int] = {}
        for index, step_id in enumerate(self._graph.ids):
            if step_id is not None:
                self._index_of.setdefault(step_id, index)

    def includes(self, index: int, other: int) -> bool:
        """Whether the step listed at `other` is an ancestor of the step listed at `index`."""
        return bool(self._bits[index] >> other & 1)

    def of(self, index: int) -> set[str]:
        """The ids of the ancestors of the step listed at `index`."""
        ids = self._graph.ids
        lowest_first = bin(self._bits[index])[:1:-1]  # one pass over the bits, not one shift per bit
        return {step_id for i, bit in enumerate(lowest_first) if bit == "1" and (step_id := ids[i]) is not None}

    def view(self, index: int) -> "AncestorView":
        """The ancestors of the step listed at `index` as a container of ids (`"plan" in view`), built lazily."""
        return AncestorView(self, index)


class AncestorView(Container[str]):
    """`step_id in view`: whether that step is among one step's ancestors (Ancestry.view)."""

    def __init__(self, ancestry: Ancestry, index: int):
        self._ancestry = ancestry
        self._index = index

    def __contains__(self, step_id: object) -> bool:
        other = self._ancestry._index_of.get(step_id) if isinstance(step_id, str) else None
        return other is not None and self._ancestry.includes(self._index, other)


def needs_of(steps: list[dict]) -> dict[str, list[str]]:
    """Each step's needs by id: its `needs` as written (duplicates dropped), or the step listed just before it
    when absent (none for the first), `[]` for none."""
    graph = _build(steps)
    result: dict[str, list[str]] = {}
    for index, step_id in enumerate(graph.ids):
        if step_id is not None and step_id not in result:
            result[step_id] = [need for n in graph.needs[index] if (need := graph.ids[n]) is not None]
    return result


def ancestors_of(steps: list[dict]) -> dict[str, set[str]]:
    """Each step's ancestors by id: the steps it needs, the steps those need, and so on. The sets together grow
    with the square of a long chain's length; Ancestry answers one question at a time without them."""
    ancestry = Ancestry(steps)
    result: dict[str, set[str]] = {}
    for index, step_id in enumerate(ancestry._graph.ids):
        if step_id is not None and step_id not in result:
            result[step_id] = ancestry.of(index)
    return result


def order(steps: list[dict]) -> list[str]:
    """The step ids in an order where every step comes after its needs, keeping list order where it can (for a
    plain list, exactly the list order). Raises ValueError when the needs form a cycle (graph_problems says
    which)."""
    graph = _build(steps)
    walked, stuck = _topological(graph)
    if stuck:
        raise ValueError(f"the needs of steps {[graph.ids[i] for i in stuck]} form or wait on a cycle")
    return [step_id for index in walked if (step_id := graph.ids[index]) is not None]


def _where(graph: _Graph, index: int) -> str:
    step_id = graph.ids[index]
    return f"steps[{index}] ({step_id})" if step_id is not None else f"steps[{index}]"


def _cycles(graph: _Graph, stuck: list[int]) -> list[list[int]]:
    """The strongly connected components of more than one step among the stuck ones (Tarjan, without recursion:
    a chain of 10,000 steps would pass Python's recursion limit), each as one cycle through it, first listed
    step first."""
    among = set(stuck)
    number: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in stuck:
        if root in number:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                number[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            nexts = [n for n in graph.needs[node] if n in among]
            if child < len(nexts):
                work.append((node, child + 1))
                target = nexts[child]
                if target not in number:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], number[target])
                continue
            if low[node] == number[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return [_cycle_through(graph, sorted(component)) for component in sorted(components, key=min)]


def _cycle_through(graph: _Graph, component: list[int]) -> list[int]:
    """A cycle inside one strongly connected component, starting at its first listed step: a shortest way back
    from each need to the start (breadth first)."""
    inside = set(component)
    start = component[0]
    came_from: dict[int, int] = {}
    frontier = [start]
    while frontier and start not in came_from:
        following = []
        for node in frontier:
            for need in graph.needs[node]:
                if need in inside and need not in came_from:
                    came_from[need] = node
                    following.append(need)
        frontier = following
    path = [start]
    node = came_from[start]
    while node != start:
        path.append(node)
        node = came_from[node]
    path.append(start)
    path.reverse()  # came_from walks back along needs; reversed, each step needs the next one
    return path


MAX_CYCLE_LINKS = 12  # a cycle through 10,000 steps is named by its first links, not a 600 kB message


def _describe_cycle(graph: _Graph, cycle: list[int]) -> str:
    links = []
    for here, there in pairwise(cycle):
        link = f"{graph.ids[here]} needs {graph.ids[there]}"
        if graph.implicit[here]:
            link += " (by default: the step listed just before it)"
        links.append(link)
    if len(links) > MAX_CYCLE_LINKS:
        more = len(links) - MAX_CYCLE_LINKS
        links = [*links[: MAX_CYCLE_LINKS - 1], f"... {more} more ...", links[-1]]
    return "needs form a cycle: " + ", ".join(links)


def graph_problems(steps: list) -> list[tuple[str, str]]:
    """What is wrong with the steps' needs, as (loc, message) with loc like "steps[3] (read).needs": not a list
    of step ids, an unknown id, a step needing itself, an id twice, a cycle (naming its steps)."""
    problems: list[tuple[str, str]] = []
    known = {step_id for step in steps if (step_id := _step_id(step)) is not None}
    graph = _build(steps)
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or "needs" not in step:
            continue
        loc = f"{_where(graph, index)}.needs"
        raw = step["needs"]
        if not isinstance(raw, list) or not all(isinstance(need, str) for need in raw):
            problems.append((loc, "must be a list of step ids"))
            continue
        seen: set[str] = set()
        for need in raw:
            if need in seen:
                problems.append((loc, f"names step {need!r} twice"))
            elif need == graph.ids[index]:
                problems.append((loc, f"step {need!r} cannot need itself"))
            elif need not in known:
                problems.append((loc, f"needs unknown step {need!r}"))
            seen.add(need)
    _, stuck = _topological(graph)
    for cycle in _cycles(graph, stuck):
        problems.append((f"{_where(graph, cycle[0])}.needs", _describe_cycle(graph, cycle)))
    return problems
