"""shardopt's implementation. Import from the public namespaces (``shardopt``, ``shardopt.schedules``, ...), not from here."""
