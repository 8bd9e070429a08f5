"""Offline stand-in for rules_java (ferry builds no Java)."""

def rules_java_dependencies():
    pass

def rules_java_toolchains():
    pass
