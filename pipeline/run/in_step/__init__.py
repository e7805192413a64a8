"""The code that runs inside a step's process: calling the step function (`call_step`), the
events and logs it writes (`step_events`, `step_logs`), its fence against a runner that lost the
step (`fence`), a gang's hosts (`gang`), its progress pulse (`pulse`) and parallel work in it
(`parallel`)."""
