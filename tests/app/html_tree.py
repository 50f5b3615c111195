"""A tiny DOM of the UI's own HTML for assertions: elements with attributes, children and text.

The renderers close every element they open (no void elements), so a stack is enough. A `<template>`'s
content is kept as its children, as a browser's `template.content` would hold it."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None] = field(default_factory=dict)
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def elements(self) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node)]

    def walk(self):
        for child in self.elements():
            yield child
            yield from child.walk()

    def find_all(self, cls: str | None = None, tag: str | None = None) -> list[Node]:
        return [n for n in self.walk() if (cls is None or cls in n.classes) and (tag is None or n.tag == tag)]

    def find(self, cls: str | None = None, tag: str | None = None) -> Node:
        found = self.find_all(cls, tag)
        assert found, f"no element with class {cls!r} / tag {tag!r}"
        return found[0]

    def following(self, node: Node) -> Node | None:
        """The element right after `node` among this node's children (its nextElementSibling)."""
        elements = self.elements()
        index = next(i for i, n in enumerate(elements) if n is node)
        return elements[index + 1] if index + 1 < len(elements) else None

    def parent_of(self, node: Node) -> Node:
        return next(n for n in [self, *self.walk()] if any(c is node for c in n.children))


class _Builder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("root")
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        self.stack.append(node)

    def handle_endtag(self, tag):
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    assert builder.stack == [builder.root], "unclosed elements"
    return builder.root
