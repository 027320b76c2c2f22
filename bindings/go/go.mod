module specinfer

go 1.23
