"""The object store: every object in memory, one resourceVersion counter for
all of them, and the watch fan-out.

Objects stored here are never mutated in place: writes store a fresh copy,
so a stored dict may be handed to watchers and readers without copying
(readers that want to change one copy it first: get() does by default).
"""

import asyncio
import collections
import copy

from . import errors

HISTORY = 20000


class Watcher:
    def __init__(self, res, namespace, match):
        self.res = res
        self.namespace = namespace
        self.match = match  # obj -> bool (label and field selectors)
        self.queue = asyncio.Queue()
        self.closed = False

    def offer(self, etype, obj, old):
        """Translates a change into what this watcher sees: an object that
        stops matching is DELETED for it, one that starts matching ADDED."""
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return
        now_in = self.match(obj)
        if etype == "ADDED":
            if now_in:
                self.queue.put_nowait(("ADDED", obj))
        elif etype == "DELETED":
            if now_in:
                self.queue.put_nowait(("DELETED", obj))
        else:
            was_in = old is not None and self.match(old)
            if now_in and was_in:
                self.queue.put_nowait(("MODIFIED", obj))
            elif now_in:
                self.queue.put_nowait(("ADDED", obj))
            elif was_in:
                self.queue.put_nowait(("DELETED", obj))


class Store:
    def __init__(self):
        self.rv = 1
        self.objects = {}  # res.key -> {(ns, name): obj}
        self.history = collections.deque(maxlen=HISTORY)  # (rv, etype, res.key, obj, old)
        self.watchers = set()
        self.listeners = []  # fn(res, etype, obj, old), called synchronously

    def _bucket(self, res):
        return self.objects.setdefault(res.key, {})

    def _next_rv(self):
        self.rv += 1
        return self.rv

    # -- reads ----------------------------------------------------------------
    def get(self, res, namespace, name, copy_=True):
        obj = self._bucket(res).get((namespace or "", name))
        if obj is None:
            return None
        return copy.deepcopy(obj) if copy_ else obj

    def list(self, res, namespace=None):
        """Stored objects (not copies: do not mutate), sorted by namespace
        and name as the API lists them."""
        items = self._bucket(res).items()
        out = [o for (ns, _), o in items if namespace is None or ns == namespace]
        out.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return out

    # -- writes ----------------------------------------------------------------
    def create(self, res, obj):
        md = obj["metadata"]
        key = (md.get("namespace") or "", md["name"])
        bucket = self._bucket(res)
        if key in bucket:
            raise errors.already_exists(res, md["name"])
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        bucket[key] = obj
        self._emit(res, "ADDED", obj, None)
        return copy.deepcopy(obj)

    def update(self, res, obj, expect_rv=None):
        """Replaces the stored object. expect_rv: the resourceVersion the
        caller read (optimistic concurrency); a mismatch is a 409 Conflict."""
        md = obj["metadata"]
        key = (md.get("namespace") or "", md["name"])
        bucket = self._bucket(res)
        old = bucket.get(key)
        if old is None:
            raise errors.not_found(res, md["name"])
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(res, md["name"], "the object has been modified; please apply "
                                  "your changes to the latest version and try again")
        obj = copy.deepcopy(obj)
        if _without_rv(obj) == _without_rv(old):
            return copy.deepcopy(old)  # no change: no new version, no event
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        bucket[key] = obj
        self._emit(res, "MODIFIED", obj, old)
        return copy.deepcopy(obj)

    def delete(self, res, namespace, name):
        bucket = self._bucket(res)
        old = bucket.pop((namespace or "", name), None)
        if old is None:
            raise errors.not_found(res, name)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._next_rv())
        self._emit(res, "DELETED", gone, old)
        return copy.deepcopy(gone)

    def _emit(self, res, etype, obj, old):
        self.history.append((self.rv, etype, res.key, obj, old))
        for w in list(self.watchers):
            if w.res.key == res.key and not w.closed:
                w.offer(etype, obj, old)
        for fn in self.listeners:
            fn(res, etype, obj, old)

    # -- persistence -----------------------------------------------------------
    def save(self, path):
        """Writes every object (and the counter) to path, atomically."""
        import json
        import os
        data = {"rv": self.rv, "objects": {k: list(v.values()) for k, v in self.objects.items()}}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
        self.saved_rv = self.rv

    def load(self, path, resources):
        import json
        with open(path) as f:
            data = json.load(f)
        self.rv = data["rv"]
        for key, objs in data["objects"].items():
            if key not in resources:
                continue
            bucket = self.objects.setdefault(key, {})
            for o in objs:
                bucket[(o["metadata"].get("namespace") or "", o["metadata"]["name"])] = o
        self.saved_rv = self.rv

    # -- watches ----------------------------------------------------------------
    def watch(self, res, namespace, match, since_rv):
        """A Watcher fed with every change after since_rv (None: from now).
        410 Gone when since_rv is older than the kept history."""
        w = Watcher(res, namespace, match)
        if since_rv is not None:
            oldest = self.history[0][0] if self.history else self.rv + 1
            if since_rv < oldest - 1 and len(self.history) == self.history.maxlen:
                raise errors.gone("too old resource version: %d (%d)" % (since_rv, oldest - 1))
            for rv, etype, key, obj, old in self.history:
                if rv > since_rv and key == res.key:
                    w.offer(etype, obj, old)
        self.watchers.add(w)
        return w

    def unwatch(self, w):
        w.closed = True
        self.watchers.discard(w)


def _without_rv(obj):
    o = dict(obj)
    md = dict(o.get("metadata") or {})
    md.pop("resourceVersion", None)
    md.pop("managedFields", None)
    o["metadata"] = md
    return o
