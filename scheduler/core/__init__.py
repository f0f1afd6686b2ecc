"""The pure core of the scheduler: no database, no store; shared by the loop and the simulator."""
