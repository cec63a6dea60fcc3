//! Actors: lookup planner, reservation manager, loaders, saver, stats reporter (issue 3).
