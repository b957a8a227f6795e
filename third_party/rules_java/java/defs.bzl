"""Thin forwards to the native Java rules (offline stand-in for rules_java)."""

def java_import(**attrs):
    native.java_import(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)
