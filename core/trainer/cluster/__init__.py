"""One ``train()`` on a Ray cluster (``run.isolation="ray"``): the connection, the actors a
service's runs train in (made, kept warm, leased), the actor itself, the storage every node
must see, and the service's side of a run there."""
