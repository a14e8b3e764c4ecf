"""What a drive is measured by; each module reads a finished drive and returns numbers for its record."""
