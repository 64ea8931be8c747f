"""The OpenAPI 3.1 description of the server's routes, written out as data (Starlette makes none).

>>> doc = openapi({"echo": {"name": "echo", "version": "1.0.0", "task": "text-embedding"}})
>>> doc["openapi"], sorted(doc["paths"])
('3.1.0', ['/health', '/metrics', '/modules/{name}', '/openapi.json', '/predict/{module}'])
>>> doc["paths"]["/predict/{module}"]["post"]["parameters"][0]["schema"]["enum"]
['echo']
"""
from __future__ import annotations

# HTTP status -> what it means here; each has the error body
ERRORS = {
    "400": "Malformed request: not JSON, not an object, a missing key or a wrong type, or an item over a limit",
    "404": "No such module (the message lists the served ones)",
    "408": "The request body did not arrive in time",
    "413": "The body or the number or size of the items is over the server's limits",
    "415": "The body is not JSON (Content-Type)",
    "500": "The module failed on this request's batch",
    "503": "Overloaded (too many requests in flight or items queued) or shutting down; retry later",
    "504": "The results were not ready in time",
}

_TEXTS = {"type": "object", "required": ["texts"], "additionalProperties": True,
          "properties": {"texts": {"type": "array", "items": {"type": "string"},
                                   "description": "One result per text, in order"}}}
_IMAGES = {"type": "object", "required": ["images"], "additionalProperties": True,
           "properties": {"images": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"},
                                     "description": "PNG or JPEG files, base64-encoded; one result per image"}}}
_RESULT = {"type": "object", "required": ["status", "msg", "results"],
           "properties": {"status": {"type": "string", "description": "'000' when ok, else the error's code"},
                          "msg": {"type": "string"}, "results": {"type": "array"}}}
_ERROR = {"allOf": [{"$ref": "#/components/schemas/Response"}],
          "properties": {"status": {"type": "string", "pattern": "^1[0-9]{2}$"},
                         "results": {"type": "array", "maxItems": 0}}}


def _json(schema_ref: str, description: str) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def openapi(modules: dict[str, dict], title: str = "paddlejax hub serving") -> dict:
    """The document for a server of ``modules`` (name -> ``info()``)."""
    names = sorted(modules)
    listed = "; ".join(f"{n} {modules[n].get('version', '')} ({modules[n].get('task', '')})" for n in names)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1",
                 "description": "PaddleHub Serving's request and response shapes; the modules served: " + listed},
        "paths": {
            "/predict/{module}": {"post": {
                "summary": "Run a module on texts or images (dynamically batched)",
                "parameters": [{"name": "module", "in": "path", "required": True,
                                "schema": {"type": "string", "enum": names}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "oneOf": [{"$ref": "#/components/schemas/TextsRequest"},
                              {"$ref": "#/components/schemas/ImagesRequest"}]}}}},
                "responses": {"200": _json("Response", "One result per item, in order"),
                              **{code: _json("Error", text) for code, text in ERRORS.items()}}}},
            "/health": {"get": {
                "summary": "Liveness and the modules served",
                "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {
                        "status": {"const": "ok"},
                        "modules": {"type": "object", "additionalProperties": {
                            "type": "object", "properties": {"version": {"type": "string"},
                                                             "task": {"type": "string"}}}}}}}}}}}},
            "/modules/{name}": {"get": {
                "summary": "A module's description: version, task, inputs and outputs",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string", "enum": names}}],
                "responses": {"200": {"description": "the module's info()",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              "404": _json("Error", ERRORS["404"])}}},
            "/metrics": {"get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "Prometheus' text format",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        },
        "components": {"schemas": {"TextsRequest": _TEXTS, "ImagesRequest": _IMAGES, "Response": _RESULT,
                                   "Error": _ERROR}},
        "x-modules": {n: modules[n] for n in names},
    }
