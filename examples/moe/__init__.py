"""A small mixture-of-experts transformer on a task whose domains need different experts."""
