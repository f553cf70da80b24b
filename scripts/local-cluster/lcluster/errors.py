"""Errors in the API's Status form (meta/v1 Status), as the API reference
describes them: `reason`, `code`, `details` {name, group, kind, causes}."""

import datetime
import secrets
import string
import uuid


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or []

    def status(self):
        s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
             "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            s["details"] = self.details
        return s


def _qual(res):
    """"pods", "jobs.batch": how the API names a resource in messages."""
    return res.plural if not res.group else "%s.%s" % (res.plural, res.group)


def not_found(res, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (_qual(res), name),
                    {"name": name, "group": res.group, "kind": res.plural})


def already_exists(res, name):
    return ApiError(409, "AlreadyExists", '%s "%s" already exists' % (_qual(res), name),
                    {"name": name, "group": res.group, "kind": res.plural})


def conflict(res, name, why):
    return ApiError(409, "Conflict",
                    'Operation cannot be fulfilled on %s "%s": %s' % (_qual(res), name, why),
                    {"name": name, "group": res.group, "kind": res.plural})


def invalid(res, kind, name, causes):
    """causes: [(field, type, detail, message)] where type is one of the
    API's cause types (FieldValueRequired, FieldValueInvalid,
    FieldValueForbidden, FieldValueNotSupported, FieldValueDuplicate) and
    message starts with "field: "."""
    msgs = [c[3] for c in causes]
    qual = kind if not res.group else "%s.%s" % (kind, res.group)
    msg = '%s "%s" is invalid: %s' % (qual, name, msgs[0] if len(msgs) == 1 else
                                      "[" + ", ".join(msgs) + "]")
    return ApiError(422, "Invalid", msg, {
        "name": name, "group": res.group, "kind": kind,
        "causes": [{"reason": c[1], "field": c[0],
                    "message": c[3][len(c[0]) + 2:] if c[3].startswith(c[0] + ": ") else c[3]}
                   for c in causes]})


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def forbidden(message, res=None, name=None, causes=None):
    details = None
    if res is not None:
        details = {"group": res.group, "kind": res.plural}
        if name:
            details["name"] = name
        if causes:
            details["causes"] = causes
    return ApiError(403, "Forbidden", message, details)


def method_not_allowed(message="the server does not allow this method on the requested resource"):
    return ApiError(405, "MethodNotAllowed", message)


def gone(message):
    return ApiError(410, "Expired", message)


def now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def rfc3339(t=None):
    t = t or now()
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(t=None):
    t = t or datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(s):
    if not s:
        return None
    s = s.replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(s)


def new_uid():
    return str(uuid.uuid4())


_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


def random_suffix(n=5):
    """Like the API's generateName suffixes: consonants and digits only."""
    return "".join(secrets.choice(_SUFFIX) for _ in range(n))


def hex_id(n=64):
    return "".join(secrets.choice(string.hexdigits.lower()[:16]) for _ in range(n))
