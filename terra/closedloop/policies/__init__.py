"""The policies that drive in the loop: the built-in ones, and adapters that let other drivers in."""
