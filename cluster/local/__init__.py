"""The store interface served in-process: ``LocalStore`` over the store parts (``parts.StoreParts``)
that a node or a broker builds, with the native engine and durable session state behind it."""
