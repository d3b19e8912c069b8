"""browse_svc: BrowseService (read-only) and AdminService (mutating) over every queue."""
