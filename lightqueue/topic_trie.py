"""The topic-filter trie: which stored MQTT topic filters match a published topic.

Every PUBLISH asks it once, so ``TopicTrie.match`` costs time in proportion to
the number of topic levels times the (small) number of live paths, plus the
matches found; it does not grow with the number of stored filters.

Layout: one ``_Node`` per distinct filter prefix. A node keeps its literal
children in a dict (created on first use), the ``+`` child in a dedicated slot,
and, instead of a ``#`` child, the text of the filter that ends in ``/#`` below
it (``#`` is always last, so it needs no node of its own). A node that ends an
exact filter keeps that filter's text. Reference counts live in one dict beside
the tree; ``remove`` prunes the nodes that become empty, so subscribe churn does
not leak memory.

Bounded work per publish (issue 26): ``match`` visits, at each depth, only
nodes whose path agrees with the topic, and two such nodes at one depth differ
only in where their ``+`` levels are. So the nodes one match visits are at most
the trie's distinct *shapes*: (depth, positions of ``+``) over every stored
filter prefix. Filters that mix ``+`` and literals over many levels make that
number, not the filter count, explode (amqtt's GHSA-2hjf-7455-w946 is the same
class). ``max_shapes`` caps it: a filter that would add shapes beyond the cap
is refused (``FilterShapeLimit``) and the trie is left unchanged, so the worst
publish costs ``max_shapes`` node visits whatever filters clients hold. Usual
filter sets have a few shapes per filter pattern (``site/+/temp`` is three).

Not thread-safe: it belongs to the reactor thread, like the rest of the store's
indexing.
"""

from __future__ import annotations

from typing import Iterator

from lightqueue.topic import TopicError, validate_topic_filter

__all__ = ["FilterShapeLimit", "TopicTrie"]


class FilterShapeLimit(TopicError):
    """A filter refused because it would take the trie past its shape budget (``max_shapes``)."""


class _Node:
    """One level of a stored filter prefix."""

    __slots__ = ("children", "plus", "hash_filter", "filter")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        """Literal next levels; None until the first one is added."""
        self.plus: _Node | None = None
        """The ``+`` next level."""
        self.hash_filter: str | None = None
        """The stored filter that is this prefix followed by ``/#`` (or ``#`` at the root)."""
        self.filter: str | None = None
        """The stored filter that ends exactly here."""

    def is_empty(self) -> bool:
        """Tell whether no stored filter passes through or ends at this node."""
        return not self.children and self.plus is None and self.hash_filter is None and self.filter is None


class TopicTrie:
    """A reference-counted set of MQTT topic filters, matched against topic names.

    ``add`` and ``remove`` take plain filters (run ``topic.parse_shared`` first
    and store the real filter of a ``$share/group/filter``). Iteration yields
    each distinct filter once, in insertion order.
    """

    __slots__ = ("_root", "_counts", "_shapes", "max_shapes", "refused")

    def __init__(self, max_shapes: int = 0) -> None:
        self._root = _Node()
        self._counts: dict[str, int] = {}
        self._shapes: dict[tuple[int, int], int] = {}  # (depth, bit mask of its + levels) -> its nodes
        self.max_shapes = max_shapes  # 0: no cap
        self.refused = 0  # filters refused for the cap

    @property
    def shapes(self) -> int:
        """Distinct node shapes stored: the most nodes one ``match`` can visit."""
        return len(self._shapes)

    def _check_shapes(self, levels: list[str]) -> None:
        """Raise ``FilterShapeLimit`` if adding a filter of ``levels`` would pass ``max_shapes``."""
        shapes = self._shapes
        new: set[tuple[int, int]] = set()
        node: _Node | None = self._root
        mask = 0
        for depth, level in enumerate(levels):
            if level == "#":
                break
            if level == "+":
                mask |= 1 << depth
                node = node.plus if node is not None else None
            else:
                node = node.children.get(level) if node is not None and node.children else None
            if node is None and (depth, mask) not in shapes:
                new.add((depth, mask))
        if new and len(shapes) + len(new) > self.max_shapes:
            self.refused += 1
            raise FilterShapeLimit(f"the broker holds filters of {len(shapes)} shapes (distinct positions of "
                                   f"'+' per depth), the most it matches per publish (max_filter_shapes = "
                                   f"{self.max_shapes}); this filter would add {len(new)}")

    def add(self, topic_filter: str, capped: bool = True) -> bool:
        """Count one more subscription to *topic_filter*; return True if it was not stored yet.

        Raises ``TopicError`` for an invalid filter, and ``FilterShapeLimit`` when
        ``capped`` and it would pass ``max_shapes``, leaving the trie unchanged.
        Uncapped adds (subscriptions accepted before a restart) may pass the cap.
        """
        count = self._counts.get(topic_filter)
        if count is not None:
            self._counts[topic_filter] = count + 1
            return False
        validate_topic_filter(topic_filter)
        levels = topic_filter.split("/")
        if self.max_shapes and capped:
            self._check_shapes(levels)
        shapes = self._shapes
        node = self._root
        mask = 0
        for depth, level in enumerate(levels):
            if level == "#":
                node.hash_filter = topic_filter
                break
            if level == "+":
                mask |= 1 << depth
                child = node.plus
                if child is None:
                    child = node.plus = _Node()
                    shapes[(depth, mask)] = shapes.get((depth, mask), 0) + 1
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                child = children.get(level)
                if child is None:
                    child = children[level] = _Node()
                    shapes[(depth, mask)] = shapes.get((depth, mask), 0) + 1
            node = child
        else:
            node.filter = topic_filter
        self._counts[topic_filter] = 1
        return True

    def remove(self, topic_filter: str) -> bool:
        """Count one subscription less; return True if the filter is now gone from the trie.

        Raises ``KeyError`` if *topic_filter* is not stored.
        """
        count = self._counts[topic_filter]
        if count > 1:
            self._counts[topic_filter] = count - 1
            return False
        del self._counts[topic_filter]
        # Walk down, remembering each (parent, level) so empty nodes can be pruned bottom-up.
        path: list[tuple[_Node, str, tuple[int, int]]] = []
        node = self._root
        mask = 0
        for depth, level in enumerate(topic_filter.split("/")):
            if level == "#":
                node.hash_filter = None
                break
            if level == "+":
                mask |= 1 << depth
            path.append((node, level, (depth, mask)))
            node = node.plus if level == "+" else node.children[level]  # type: ignore[index,assignment]
        else:
            node.filter = None
        shapes = self._shapes
        while path and node.is_empty():
            parent, level, shape = path.pop()
            left = shapes[shape] - 1
            if left:
                shapes[shape] = left
            else:
                del shapes[shape]
            if level == "+":
                parent.plus = None
            else:
                children = parent.children
                del children[level]  # type: ignore[arg-type]
                if not children:
                    parent.children = None
            node = parent
        return True

    def match(self, topic: str) -> list[str]:
        """Return every stored filter matching the topic name *topic*, each once, in no set order.

        Follows MQTT 3.1.1 section 4.7: ``+`` matches one level (an empty one
        too), ``#`` matches the parent level and everything below, and a topic
        starting with ``$`` is not matched by a filter starting with ``+`` or
        ``#`` (MQTT-4.7.2-1). *topic* is assumed to be a valid topic name.
        """
        # Hot path: one split, a frontier of nodes per level, no recursion, no generators.
        levels = topic.split("/")
        result: list[str] = []
        root = self._root
        frontier: list[_Node] = []
        children = root.children
        if children is not None:
            child = children.get(levels[0])
            if child is not None:
                frontier.append(child)
        if not topic.startswith("$"):
            if root.hash_filter is not None:
                result.append(root.hash_filter)
            if root.plus is not None:
                frontier.append(root.plus)
        for index in range(1, len(levels)):
            if not frontier:
                return result
            level = levels[index]
            following: list[_Node] = []
            for node in frontier:
                if node.hash_filter is not None:
                    result.append(node.hash_filter)
                children = node.children
                if children is not None:
                    child = children.get(level)
                    if child is not None:
                        following.append(child)
                if node.plus is not None:
                    following.append(node.plus)
            frontier = following
        for node in frontier:
            if node.filter is not None:
                result.append(node.filter)
            if node.hash_filter is not None:  # "sport/#" matches "sport"
                result.append(node.hash_filter)
        return result

    def count(self, topic_filter: str) -> int:
        """Return how many subscriptions hold *topic_filter* (0 when it is not stored)."""
        return self._counts.get(topic_filter, 0)

    def node_count(self) -> int:
        """Count the trie's nodes, root included, by walking it (a diagnostic: O(nodes))."""
        total = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            total += 1
            if node.children:
                stack.extend(node.children.values())
            if node.plus is not None:
                stack.append(node.plus)
        return total

    def __len__(self) -> int:
        """Return the number of distinct stored filters."""
        return len(self._counts)

    def __contains__(self, topic_filter: object) -> bool:
        """Tell whether *topic_filter* is stored (its count is at least 1)."""
        return topic_filter in self._counts

    def __iter__(self) -> Iterator[str]:
        """Iterate over the distinct stored filters, in insertion order."""
        return iter(self._counts)

    def __repr__(self) -> str:
        return f"<TopicTrie filters={len(self._counts)}>"
