"""What people see and hear of a run: the lines and the live display (`console`, `reporter`),
and the webhooks (`alerts`)."""
